"""`bandmaster demo`: start the local cluster, show what it sees, stop everything."""

from __future__ import annotations

import argparse
import sys
import time

import grpc

from bandmaster.capacity.v1 import capacity_pb2, capacity_pb2_grpc
from services.cli.cluster import start_cluster
from services.cli.supervisor import StartupError
from services.cli.table import render_table
from services.cli.up import add_cluster_arguments, cluster_config
from services.common.logs import setup_logging


def add_parser(commands) -> None:
    parser = commands.add_parser("demo", help="start a local cluster, run a short workload, print results, stop")
    add_cluster_arguments(parser)
    parser.set_defaults(run=run, worker_speedup=10.0, log_level="WARNING")


def wait_for_workers(address: str, expected: int, timeout_s: float = 30.0) -> capacity_pb2.WorkersSnapshot:
    """Poll ListWorkers until `expected` workers are HEALTHY (the capacity service polls them itself)."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(address) as channel:
        stub = capacity_pb2_grpc.CapacityStub(channel)
        while True:
            snapshot = stub.ListWorkers(capacity_pb2.ListWorkersRequest(), timeout=5)
            healthy = [w for w in snapshot.workers if w.health == capacity_pb2.WORKER_HEALTH_HEALTHY]
            if len(healthy) >= expected or time.monotonic() > deadline:
                return snapshot
            time.sleep(0.2)


def capacity_table(snapshot: capacity_pb2.WorkersSnapshot) -> str:
    rows = []
    for worker in snapshot.workers:
        health = capacity_pb2.WorkerHealth.Name(worker.health).removeprefix("WORKER_HEALTH_")
        if not worker.replicas:
            rows.append([worker.worker_id, "-", health, 0, 0, 0, "-", worker.excluded_reason or "-"])
        for replica in worker.replicas:
            source = capacity_pb2.RetentionSource.Name(replica.retention_source).removeprefix("RETENTION_SOURCE_")
            rows.append([worker.worker_id, replica.dp_rank, health, replica.gpu_kv_tokens, replica.host_kv_tokens,
                         replica.retention_tokens, source, worker.excluded_reason or "-"])
    return render_table(
        ["worker", "dp", "health", "gpu_kv_tokens", "host_kv_tokens", "retention_tokens", "source", "excluded"],
        rows, title=f"Capacity snapshot v{snapshot.version}: {snapshot.total_retention_tokens:,} retention tokens",
    )


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    config = cluster_config(args)
    print(f"Starting a local cluster: {config.workers} simulated workers, capacity service ...", flush=True)
    try:
        cluster = start_cluster(config)
    except StartupError as exc:
        print(f"bandmaster demo: {exc}", file=sys.stderr)
        return 1
    try:
        print(render_table(["process", "endpoint"], cluster.endpoints()))
        snapshot = wait_for_workers(cluster.capacity.endpoint, len(cluster.workers))
        print()
        print(capacity_table(snapshot))
        healthy = sum(1 for w in snapshot.workers if w.health == capacity_pb2.WORKER_HEALTH_HEALTHY)
        if healthy < len(cluster.workers):
            print(f"bandmaster demo: only {healthy} of {len(cluster.workers)} workers became healthy", file=sys.stderr)
            return 1
        return 0
    finally:
        cluster.stop()
        print("\nCluster stopped.", flush=True)
