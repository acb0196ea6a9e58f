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
3. live (not in --smoke): `bandmaster up` with two simulated workers; agents' steps/min alone and with a
   concurrent batch (target: the batch slows agents by < 5%), the batch's share of the capacity the agents
   left idle (target >= 70%), and the deadline hit rate of batches sized to fit (see `live`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.machine import machine
from services.common.process.child_start import start_child
from services.common.process.child_stop import stop_child
from services.common.process.ready import read_ready_file, wait_ready_file
from services.common.web.session_ids import SESSION_HEADER
from services.planner.core.batch_policy import BatchPolicyConfig
from services.planner.core.scaling import LoadScalingConfig, ProgramScalingConfig, ThroughputScalingConfig
from services.planner.core.throughput import EngineRate
from services.planner.core.tick import TickSettings, TickState, decide
from services.planner.core.types import (
    DispatcherFeedback,
    Inventory,
    JobDemand,
    Observation,
    OnlineTraffic,
    ProgramSignal,
    ReplicaLoad,
)

ROOT = Path(__file__).resolve().parent.parent


def core_tick(jobs: int, workers: int, ticks: int) -> dict:
    now, wall = 10_000.0, 1_700_000_000.0
    demands = tuple(
        JobDemand(f"job-{i:05d}", "in_progress", 1000, i % 500, i % 7, wall + 600 + 37 * i, now - 1)
        for i in range(jobs)
    )
    loads = tuple(ReplicaLoad(f"w{i}", 8, i % 3, 0.3 + (i % 10) / 20) for i in range(workers))
    obs = Observation(
        now,
        wall,
        demands,
        OnlineTraffic(now - 1, 120.0, 40),
        DispatcherFeedback(now - 1, 10.0, 5000, 64, 30.0, 40.0),
        Inventory(now - 1, workers, workers),
        loads,
        ProgramSignal(now - 1, 3, 12.0, 0.82, workers),
    )
    settings = TickSettings(
        batch=BatchPolicyConfig(safe_rps_per_ready_replica=4.0, max_replicas=128, min_replicas=1),
        load=LoadScalingConfig(),
        throughput=ThroughputScalingConfig(enabled=True),
        programs=ProgramScalingConfig(),
        engine=EngineRate(4.8, 32, 45.0),
    )
    state = TickState()
    times = []
    for i in range(ticks):
        t0 = time.perf_counter()
        decision, state = decide(obs, settings, state, f"d-{i}")
        times.append(time.perf_counter() - t0)
    times.sort()
    return {
        "jobs": jobs,
        "workers": workers,
        "ticks": ticks,
        "median_ms": statistics.median(times) * 1e3,
        "p99_ms": times[min(len(times) - 1, int(0.99 * len(times)))] * 1e3,
        "last_decision": {
            "action": decision.action,
            "lease_rps": decision.lease.max_admission_rps,
            "replica_floor": decision.plan.replica_floor,
            "scale_to": decision.scale_to,
        },
    }


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

    return {
        "count": int(count),
        "mean_ms": total / count * 1e3 if count else None,
        "p50_ms": quantile(0.5),
        "p99_ms": quantile(0.99),
        "note": "quantiles interpolated within histogram buckets",
    }


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
    redis = start_child([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"], None)
    ready = tmp / "ready.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    planner = None
    try:
        time.sleep(0.3)
        planner = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "services.planner",
                "--listen",
                "127.0.0.1:0",
                "--metrics-port",
                "0",
                "--registry-path",
                str(tmp / "planner.sqlite3"),
                "--ready-file",
                str(ready),
                "--lease-store",
                "redis",
                "--redis-url",
                f"redis://127.0.0.1:{port}/0",
                "--tick-interval-seconds",
                "0.05",
                "--virtual-initial-replicas",
                str(workers),
                "--max-replicas",
                "128",
                "--assume-no-online-traffic",
                "--safe-rps-per-replica",
                "4",
                "--log-level",
                "WARNING",
            ],
            cwd=ROOT,
            env=env,
        )
        info = wait_ready_file(ready, 60, alive=lambda: planner.poll() is None)
        if info is None:
            raise RuntimeError("the planner did not start")
        with grpc.insecure_channel(info["grpc"]) as ch:
            stub = pb_grpc.PlannerStub(ch)
            deadline_ts = Timestamp()
            for i in range(jobs):
                deadline_ts.FromSeconds(int(time.time()) + 3600 + 10 * i)
                stub.SubmitBatchJob(
                    pb.SubmitBatchJobRequest(total_requests=1000, deadline=deadline_ts, job_id=f"bench-{i}"), timeout=10
                )
        time.sleep(1.0)  # let ticks with every job run before measuring
        base = urllib.request.urlopen(f"http://127.0.0.1:{info['metrics_port']}/metrics", timeout=5).read().decode()
        time.sleep(seconds)
        text = urllib.request.urlopen(f"http://127.0.0.1:{info['metrics_port']}/metrics", timeout=5).read().decode()
        with grpc.insecure_channel(info["grpc"]) as ch:
            plan = pb_grpc.PlannerStub(ch).GetPlan(pb.GetPlanRequest(), timeout=5)
        return {
            "jobs": jobs,
            "workers": workers,
            "seconds": seconds,
            "tick": _summary(
                _minus(
                    _histogram(text, "bandmaster_planner_tick_seconds"),
                    _histogram(base, "bandmaster_planner_tick_seconds"),
                )
            ),
            "lease_publish_redis": _summary(
                _minus(
                    _histogram(text, "bandmaster_planner_lease_publish_seconds"),
                    _histogram(base, "bandmaster_planner_lease_publish_seconds"),
                )
            ),
            "last_plan": {
                "action": plan.action,
                "active_jobs": plan.observation.active_jobs,
                "lease_rps": plan.leases[0].max_admission_rps if plan.leases else None,
                "effects": plan.effects_outcome,
            },
        }
    finally:
        stop_child(planner, 20.0, name="planner")
        stop_child(redis, 10.0, name="redis-server")
        shutil.rmtree(tmp, ignore_errors=True)


# -- 3. live: agents with and without a concurrent batch on a local cluster ---------------------------

LIVE_MODEL = "bandmaster-sim"


def _post(url: str, body: dict, headers: dict, timeout_s: float = 60) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json", **headers}
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def _agents(base_url: str, agents: int, seconds: float, tool_s: float, tag: str) -> int:
    """`agents` programs in threads for `seconds`: each step one chat turn (history grows) then a tool call
    (`tool_s`); returns the steps completed."""
    import threading

    stop_at = time.monotonic() + seconds
    steps = [0] * agents

    def agent(i: int) -> None:
        messages = [{"role": "system", "content": f"agent {tag}-{i} " + "context " * 200}]
        while time.monotonic() < stop_at:
            messages.append({"role": "user", "content": f"step {steps[i]}: observe and act"})
            try:
                answer = _post(
                    base_url + "/chat/completions",
                    {"model": LIVE_MODEL, "messages": messages, "max_tokens": 32},
                    {SESSION_HEADER: f"{tag}-{i}"},
                )
            except OSError:
                continue
            messages.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
            if time.monotonic() < stop_at:
                steps[i] += 1
            time.sleep(tool_s)

    threads = [threading.Thread(target=agent, args=(i,), daemon=True) for i in range(agents)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(steps)


def _batch_lines(n: int, tag: str) -> bytes:
    return "".join(
        json.dumps(
            {
                "custom_id": f"{tag}-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": LIVE_MODEL,
                    "max_tokens": 32,
                    "messages": [{"role": "user", "content": f"summarise document {i} " * 20}],
                },
            }
        )
        + "\n"
        for i in range(n)
    ).encode()


def live(seconds: float, agents: int, workers: int, speedup: float, safe_rps: float, tool_s: float) -> dict:
    """`bandmaster up` (a subprocess) with `workers` simulated workers at `speedup`; the planner told that one
    replica drains `safe_rps` batch requests/s safely. Phase A: agents alone for `seconds`; phase B: the same
    agents while a batch larger than the phase can drain is running. Idle capacity is the planner's own
    definition, workers x safe_rps - online rps (phase A's agent turn rate); the batch's share of it is its
    completed requests/s in phase B over that. Then batches sized to half the idle capacity over a 1-minute
    window: did each complete before its deadline?"""
    import io

    import openai

    tmp = Path(tempfile.mkdtemp(prefix="planner-live-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("BANDMASTER_")}
    env["PYTHONPATH"] = str(ROOT)
    up = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.cli",
            "up",
            "--workers",
            str(workers),
            "--speedup",
            str(speedup),
            "--ports",
            "auto",
            "--state-dir",
            str(tmp),
            "--log-level",
            "WARNING",
            f"--planner-arg=--safe-rps-per-replica={safe_rps}",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = up.stdout.readline()
            if not line or "Ctrl-C to stop" in line:
                break
        router = read_ready_file(tmp / "router.ready.json")
        if router is None:
            raise RuntimeError(f"bandmaster up wrote no router ready file in {tmp}")
        base_url = f"http://127.0.0.1:{router['http_port']}/v1"
        client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=2)
        _agents(base_url, agents, 2.0, tool_s, "warm")  # warm-up: connections, caches

        alone = _agents(base_url, agents, seconds, tool_s, "a")
        online_rps = alone / seconds
        idle_rps = max(0.0, workers * safe_rps - online_rps)
        n = int(idle_rps * seconds * 2) + 10  # more than phase B can drain
        f = client.files.create(file=("bg.jsonl", io.BytesIO(_batch_lines(n, "bg"))), purpose="batch")
        batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="1h")
        time.sleep(1.0)  # the first lease
        start_done = client.batches.retrieve(batch.id).request_counts.completed
        t0 = time.monotonic()
        together = _agents(base_url, agents, seconds, tool_s, "b")
        batch_rps = (client.batches.retrieve(batch.id).request_counts.completed - start_done) / (time.monotonic() - t0)
        client.batches.cancel(batch.id)

        fits = []
        for _ in range(120):  # wait for the cancelled batch to settle
            if client.batches.retrieve(batch.id).status == "cancelled":
                break
            time.sleep(0.5)
        sized = int(0.5 * idle_rps * 50 / 2)  # two at once: half the idle capacity
        ids = []
        for k in range(2):
            fk = client.files.create(
                file=(f"fit{k}.jsonl", io.BytesIO(_batch_lines(max(1, sized), f"fit{k}"))), purpose="batch"
            )
            ids.append(
                client.batches.create(input_file_id=fk.id, endpoint="/v1/chat/completions", completion_window="1m").id
            )
        end = time.monotonic() + 90
        while time.monotonic() < end:
            got = [client.batches.retrieve(i) for i in ids]
            if all(b.status in ("completed", "expired", "failed", "cancelled") for b in got):
                break
            time.sleep(0.5)
        for b in got:
            fits.append(
                {
                    "requests": b.request_counts.total,
                    "status": b.status,
                    "hit": b.status == "completed" and b.completed_at is not None and b.completed_at <= b.expires_at,
                }
            )
        slowdown = 1.0 - together / alone if alone else None
        share = batch_rps / idle_rps if idle_rps else None
        return {
            "seconds_per_phase": seconds,
            "agents": agents,
            "workers": workers,
            "speedup": speedup,
            "safe_rps_per_replica": safe_rps,
            "tool_seconds": tool_s,
            "agent_steps_per_min_alone": alone / seconds * 60,
            "agent_steps_per_min_with_batch": together / seconds * 60,
            "agent_slowdown": slowdown,
            "target_agent_slowdown_below": 0.05,
            "online_rps": online_rps,
            "idle_capacity_rps": idle_rps,
            "batch_rps_during_agents": batch_rps,
            "batch_share_of_idle_capacity": share,
            "target_share_at_least": 0.70,
            "deadline_batches": fits,
            "deadline_hit_rate": sum(x["hit"] for x in fits) / len(fits) if fits else None,
            "note": "idle capacity = workers x safe_rps - online rps (the planner's own definition); live on "
            "this machine's shared cores, so agents, router, planner and workers compete for CPU",
        }
    finally:
        if up.poll() is None:
            up.send_signal(2)
            try:
                up.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                up.kill()
                up.communicate()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.planner_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/planner.json")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for tests (no live part)")
    parser.add_argument("--no-live", action="store_true", help="skip the live agents-with-batch part")
    parser.add_argument("--live-seconds", type=float, default=30.0, help="length of each live phase")
    parser.add_argument("--live-agents", type=int, default=4)
    parser.add_argument("--live-tool-seconds", type=float, default=1.0, help="each agent's tool time between turns")
    parser.add_argument("--live-speedup", type=float, default=20.0)
    parser.add_argument("--live-safe-rps", type=float, default=10.0, help="the planner's safe batch rps per replica")
    args = parser.parse_args(argv)
    jobs, workers = (50, 8) if args.smoke else (1000, 64)
    report = {
        "machine": machine(),
        "core_tick": core_tick(jobs, workers, 20 if args.smoke else 200),
        "process": process(jobs, workers, 1.0 if args.smoke else 10.0),
    }
    if not args.smoke and not args.no_live:
        report["live"] = live(
            args.live_seconds,
            agents=args.live_agents,
            workers=2,
            speedup=args.live_speedup,
            safe_rps=args.live_safe_rps,
            tool_s=args.live_tool_seconds,
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
