"""Planner benchmark: tick cost at scale and lease publication latency to Redis.

    python -m bench.planner_bench --out bench/results/planner.json [--smoke]

1. core_tick: the pure tick (`services.planner.core.tick.decide`) with 1,000 active batch jobs
   (EDF over their deadlines), 64 worker replicas with load reports and a program signal, every
   proposer on; median and p99 of N ticks.
2. process: `python -m services.planner` as a subprocess on the virtual connector with 64
   replicas, 1,000 jobs submitted over gRPC (SubmitBatchJob), the Redis lease store against a
   real `redis-server` on a free loopback port; after it has ticked for a while we read its own
   histograms from /metrics: the whole tick (observe + decide + effects) and the lease publication
   (one fenced Lua write, acknowledged). Skipped when `redis-server` is not installed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from services.planner.core.batch_policy import BatchPolicyConfig
from services.planner.core.scaling import LoadScalingConfig, ProgramScalingConfig, ThroughputScalingConfig
from services.planner.core.throughput import EngineRate
from services.planner.core.tick import TickSettings, TickState, decide
from services.planner.core.types import (DispatcherFeedback, Inventory, JobDemand, Observation, OnlineTraffic,
                                         ProgramSignal, ReplicaLoad)

ROOT = Path(__file__).resolve().parent.parent


def core_tick(jobs: int, workers: int, ticks: int) -> dict:
    now, wall = 10_000.0, 1_700_000_000.0
    demands = tuple(JobDemand(f"job-{i:05d}", "in_progress", 1000, i % 500, i % 7, wall + 600 + 37 * i, now - 1)
                    for i in range(jobs))
    loads = tuple(ReplicaLoad(f"w{i}", 8, i % 3, 0.3 + (i % 10) / 20) for i in range(workers))
    obs = Observation(now, wall, demands, OnlineTraffic(now - 1, 120.0, 40),
                      DispatcherFeedback(now - 1, 10.0, 5000, 64, 30.0, 40.0), Inventory(now - 1, workers, workers),
                      loads, ProgramSignal(now - 1, 3, 12.0, 0.82, workers))
    settings = TickSettings(batch=BatchPolicyConfig(safe_rps_per_ready_replica=4.0, max_replicas=128, min_replicas=1),
                            load=LoadScalingConfig(), throughput=ThroughputScalingConfig(enabled=True),
                            programs=ProgramScalingConfig(), engine=EngineRate(4.8, 32, 45.0))
    state = TickState()
    times = []
    for i in range(ticks):
        t0 = time.perf_counter()
        decision, state = decide(obs, settings, state, f"d-{i}")
        times.append(time.perf_counter() - t0)
    times.sort()
    return {"jobs": jobs, "workers": workers, "ticks": ticks, "median_ms": statistics.median(times) * 1e3,
            "p99_ms": times[min(len(times) - 1, int(0.99 * len(times)))] * 1e3,
            "last_decision": {"action": decision.action, "lease_rps": decision.lease.max_admission_rps,
                              "replica_floor": decision.plan.replica_floor, "scale_to": decision.scale_to}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _histogram(text: str, name: str) -> tuple[list[tuple[float, float]], float, float]:
    """(cumulative buckets, sum, count) of one Prometheus histogram in a /metrics page."""
    buckets, total, count = [], 0.0, 0.0
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket"):
            le = line.split('le="')[1].split('"')[0]
            buckets.append((math.inf if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
        elif line.startswith(f"{name}_sum"):
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith(f"{name}_count"):
            count = float(line.rsplit(" ", 1)[1])
    return buckets, total, count


def _minus(after, before):
    b_after, s_after, c_after = after
    b_before, _, _ = before
    prior = dict(b_before)
    return [(le, n - prior.get(le, 0.0)) for le, n in b_after], s_after - before[1], c_after - before[2]


def _summary(hist) -> dict:
    buckets, total, count = hist

    def quantile(q: float) -> float | None:
        if not count:
            return None
        prev_le, prev_n = 0.0, 0.0
        for le, n in buckets:
            if n >= q * count:
                if math.isinf(le):
                    return prev_le * 1e3
                frac = (q * count - prev_n) / max(n - prev_n, 1e-9)
                return (prev_le + frac * (le - prev_le)) * 1e3
            prev_le, prev_n = le, n
        return None
    return {"count": int(count), "mean_ms": total / count * 1e3 if count else None, "p50_ms": quantile(0.5),
            "p99_ms": quantile(0.99), "note": "quantiles interpolated within histogram buckets"}


def process(jobs: int, workers: int, seconds: float) -> dict:
    binary = shutil.which("redis-server")
    if binary is None:
        return {"skipped": "redis-server is not installed"}
    import grpc
    from google.protobuf.timestamp_pb2 import Timestamp

    from bandmaster.planner.v1 import planner_pb2 as pb
    from bandmaster.planner.v1 import planner_pb2_grpc as pb_grpc

    tmp = Path(tempfile.mkdtemp(prefix="planner-bench-"))
    port = _free_port()
    redis = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ready = tmp / "ready.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    planner = None
    try:
        time.sleep(0.3)
        planner = subprocess.Popen([
            sys.executable, "-m", "services.planner", "--listen", "127.0.0.1:0", "--metrics-port", "0",
            "--http-listen", "127.0.0.1:0", "--registry-path", str(tmp / "planner.sqlite3"), "--ready-file", str(ready),
            "--lease-store", "redis", "--redis-url", f"redis://127.0.0.1:{port}/0", "--tick-interval-seconds", "0.05",
            "--virtual-initial-replicas", str(workers), "--max-replicas", "128", "--assume-no-online-traffic",
            "--safe-rps-per-replica", "4", "--log-level", "WARNING"], cwd=ROOT, env=env)
        deadline = time.monotonic() + 60
        while not ready.exists():
            if time.monotonic() > deadline or planner.poll() is not None:
                raise RuntimeError("the planner did not start")
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        with grpc.insecure_channel(info["grpc"]) as ch:
            stub = pb_grpc.PlannerStub(ch)
            deadline_ts = Timestamp()
            for i in range(jobs):
                deadline_ts.FromSeconds(int(time.time()) + 3600 + 10 * i)
                stub.SubmitBatchJob(pb.SubmitBatchJobRequest(total_requests=1000, deadline=deadline_ts,
                                                             job_id=f"bench-{i}"), timeout=10)
        time.sleep(1.0)             # let ticks with every job run before measuring
        base = urllib.request.urlopen(f"http://127.0.0.1:{info['metrics_port']}/metrics", timeout=5).read().decode()
        time.sleep(seconds)
        text = urllib.request.urlopen(f"http://127.0.0.1:{info['metrics_port']}/metrics", timeout=5).read().decode()
        with grpc.insecure_channel(info["grpc"]) as ch:
            plan = pb_grpc.PlannerStub(ch).GetPlan(pb.GetPlanRequest(), timeout=5)
        return {"jobs": jobs, "workers": workers, "seconds": seconds,
                "tick": _summary(_minus(_histogram(text, "bandmaster_planner_tick_seconds"),
                                        _histogram(base, "bandmaster_planner_tick_seconds"))),
                "lease_publish_redis": _summary(_minus(_histogram(text, "bandmaster_planner_lease_publish_seconds"),
                                                       _histogram(base, "bandmaster_planner_lease_publish_seconds"))),
                "last_plan": {"action": plan.action, "active_jobs": plan.observation.active_jobs,
                              "lease_rps": plan.leases[0].max_admission_rps if plan.leases else None,
                              "effects": plan.effects_outcome}}
    finally:
        if planner is not None:
            planner.terminate()
            planner.wait(timeout=20)
        redis.terminate()
        redis.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.planner_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/planner.json")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for tests")
    args = parser.parse_args(argv)
    jobs, workers = (50, 8) if args.smoke else (1000, 64)
    report = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "core_tick": core_tick(jobs, workers, 20 if args.smoke else 200),
        "process": process(jobs, workers, 1.0 if args.smoke else 10.0),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
