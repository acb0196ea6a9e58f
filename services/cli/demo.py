"""`bandmaster demo`: start the local cluster, show what it sees, stop everything."""

from __future__ import annotations

import argparse
import asyncio
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
    parser.add_argument("--programs", type=int, default=16, help="agent programs to run, all in parallel")
    parser.add_argument("--max-turns", type=int, default=16, help="turns per program (the trace's first turns)")
    parser.add_argument("--token-scale", type=float, default=1.0, help="scale the trace's token counts")
    parser.add_argument("--workload", default="swe", choices=("swe", "synthetic", "short"))
    parser.set_defaults(run=run, worker_speedup=20.0, worker_kv_tokens=65_536, http_port=0, log_level="WARNING")


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


async def _run_workload(args: argparse.Namespace, cluster) -> dict:
    from bench.progress import ProgressBar
    from bench.run import Runner, build_workload, scrape_counters

    programs = build_workload(args.workload, args.programs, seed=0, max_turns=args.max_turns,
                              token_scale=args.token_scale, tool_time_scale=1.0)
    progress = ProgressBar(sum(len(p.turns) for p in programs), label="turns", log_every_s=2.0)
    runner = Runner(cluster.http_url + "/v1", args.model_name, time_scale=args.worker_speedup, progress=progress,
                    arm="bandmaster")
    before = await scrape_counters(cluster.workers)
    result = await runner.run(programs, len(programs))
    progress.close()
    after = await scrape_counters(cluster.workers)
    result.worker_counters = {k: after[k] - before[k] for k in after}
    summary = result.summary()
    summary.update(scheduler_counts(cluster))
    return summary


def scheduler_counts(cluster) -> dict:
    if cluster.scheduler is None:
        return {}
    from bandmaster.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc

    with grpc.insecure_channel(cluster.scheduler.endpoint) as channel:
        stats = scheduler_pb2_grpc.SchedulerStub(channel).GetStats(scheduler_pb2.GetStatsRequest(), timeout=5)
    return {"pauses": stats.pauses_total, "resumes": stats.resumes_total, "forced_resumes": stats.forced_resumes_total}


def results_table(summary: dict) -> str:
    rows = [
        ["programs done", f"{summary['programs_done']} / {summary['programs_total']}"],
        ["turns (ok / failed)", f"{summary['turns_ok']} / {summary['turns_failed']}"],
        ["steps per minute", f"{summary['steps_per_min']:.1f}"],
        ["program time p50 / p90", f"{summary['program_time_p50_s']:.1f} s / {summary['program_time_p90_s']:.1f} s"],
        ["time to first token p50 / p90", f"{summary['ttft_p50_s']:.2f} s / {summary['ttft_p90_s']:.2f} s"],
        ["KV hit rate", f"{summary['kv_hit_rate']:.1%}"],
        ["recomputed tokens (workers)", f"{int(summary.get('worker_recomputed_tokens', 0)):,}"],
        ["pauses / resumes", f"{summary.get('pauses', 0)} / {summary.get('resumes', 0)}"],
    ]
    return render_table(["result", "value"], rows,
                        title="Results (times in simulated seconds of the modelled hardware)")


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
        print(f"\nRunning {args.programs} agent programs ({args.workload} workload, {args.max_turns} turns each) "
              f"through {cluster.http_url}/v1 ...", flush=True)
        summary = asyncio.run(_run_workload(args, cluster))
        print()
        print(results_table(summary))
        return 0 if summary["turns_failed"] == 0 and summary["programs_done"] == summary["programs_total"] else 1
    finally:
        cluster.stop()
        print("\nCluster stopped.", flush=True)
