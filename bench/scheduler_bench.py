"""Scheduler benchmark: control tick cost at scale, and Admit+Complete round trips over real gRPC.

    python -m bench.scheduler_bench --out bench/results/scheduler.json [--smoke]

1. tick: the pure core with 10,000 programs on 64 replicas (mixed sizes, mostly ACTING, some turns
   in flight, enough pressure that pauses, marks and resumes happen), timing `core.tick(now)` while
   a share of programs takes a turn between ticks. Then the same at 1,000 / 10,000 / 50,000 programs
   (`--scaling-programs`): p50 / p99 per size, per program, and their growth against linear.
2. rpc: `python -m services.capacity` (one sglang_stub worker with a large KV pool over 8 DP ranks,
   so nothing ever pauses) and `python -m services.scheduler` as subprocesses; N concurrent callers
   in this process each loop Admit -> Complete for their own program over a few gRPC channels.
   One round trip = Admit + Complete; we report round trips per second and the p50/p99 latency.
   The scheduler keeps its table in a SQLite file (the service default), so this includes the
   batched write-through.
3. recovery: a table of 10,000 programs (the tick benchmark's, after a few ticks: some paused, some
   turns in flight) stored in SQLite (and in Redis when `redis-server` is installed); the time a
   restarting scheduler takes to load it and rebuild its core (the figure it logs and exports as
   `bandmaster_scheduler_state_recovery_seconds`), median of 3.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

import grpc
from prometheus_client import CollectorRegistry

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from bandmaster.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from clients.stats import percentile
from services.common.clock import SystemClock
from services.common.process import orphan_guard
from services.common.process.child_start import start_child
from services.common.process.child_stop import stop_child, stop_child_async
from services.common.process.ready import wait_ready_file_async
from services.scheduler.adapters.state_store import (
    RedisStateStore,
    SqliteStateStore,
    WriteBatch,
    encode_meta,
    encode_program,
    encode_ticket,
)
from services.scheduler.core import CapacitySnapshot, ControlParams, ReplicaCapacity, SchedulerCore, Verdict, durable
from services.scheduler.metrics import SchedulerMetrics
from services.scheduler.persist import StatePersister
from tests.support.sglang_stub import SglangStub, sglang_info

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------- 1. tick


def bench_tick(programs: int, replicas: int, ticks: int, seed: int = 7, core: SchedulerCore | None = None) -> dict:
    rng = random.Random(seed)
    core = core or SchedulerCore(ControlParams(scheduler_interval_seconds=5.0, acting_decay_tau_seconds=30.0))
    sizes = [min(120_000, int(rng.lognormvariate(9.0, 0.9))) for _ in range(programs)]
    # Budget = the total footprint: placement keeps replicas under the pause threshold, turns then grow
    # programs past it, so every tick has pauses, marks and resumes to do.
    per_replica = int(sum(s + 100 for s in sizes) / replicas)
    core.apply_capacity(
        0.0, CapacitySnapshot(1, tuple(ReplicaCapacity(f"w{i // 8}", i % 8, per_replica, 64) for i in range(replicas)))
    )
    now = 0.0
    counter = 0
    in_flight: dict[str, str] = {}
    for i, size in enumerate(sizes):
        counter += 1
        rid = f"r{counter}"
        result = core.admit(now, f"p{i}", f"p{i // 10 * 10}" if i % 10 else "", size // 4, rid)
        if result.decision.verdict is Verdict.PLACED and rng.random() < 0.9:
            core.complete(now, f"p{i}", rid, result.decision.replica, size, size // 20)
        else:
            in_flight[f"p{i}"] = rid
    durations_ms: list[float] = []
    totals = {"paused": 0, "marked": 0, "resumed": 0, "expired": 0}
    for _ in range(ticks):
        now += 5.0
        # Between ticks: a share of the programs finish or start a turn.
        for sid in rng.sample(range(programs), max(1, programs // 20)):
            name = f"p{sid}"
            if name in in_flight:
                rid = in_flight.pop(name)
                core.complete(now, name, rid, None, sizes[sid], sizes[sid] // 20)
            elif core.program(name) is not None:
                counter += 1
                rid = f"r{counter}"
                core.admit(now, name, "", 0, rid)
                in_flight[name] = rid
        started = time.perf_counter()
        ticked = core.tick(now)
        durations_ms.append((time.perf_counter() - started) * 1e3)
        for key in totals:
            totals[key] += getattr(ticked, key)
    stats = core.stats(now)
    return {
        "programs": programs,
        "replicas": replicas,
        "ticks": ticks,
        "retention_tokens_per_replica": per_replica,
        "tick_ms": {
            "p50": percentile(durations_ms, 50),
            "p99": percentile(durations_ms, 99),
            "max": max(durations_ms),
            "mean": sum(durations_ms) / len(durations_ms),
        },
        "activity": {**totals, "paused_now": stats.programs_paused, "waiting_admissions": stats.waiting_admissions},
    }


def bench_tick_scaling(sizes: list[int], replicas: int, ticks: int) -> dict:
    """The tick benchmark at each fleet size (the same mix, the budget scaled with the programs): its
    p50 / p99 and their cost per program, and how the cost grows from the smallest size to the largest
    relative to the programs (growth 1.0 = linear; above it, superlinear)."""
    runs = []
    for programs in sizes:
        run = bench_tick(programs, replicas, ticks)
        p50, p99 = run["tick_ms"]["p50"], run["tick_ms"]["p99"]
        runs.append(
            {
                "programs": programs,
                "p50_ms": p50,
                "p99_ms": p99,
                "p50_us_per_program": p50 * 1e3 / programs,
                "p99_us_per_program": p99 * 1e3 / programs,
                "activity": run["activity"],
            }
        )
    first, last = runs[0], runs[-1]
    scale = last["programs"] / first["programs"]
    return {
        "replicas": replicas,
        "ticks": ticks,
        "runs": runs,
        "p50_growth": (last["p50_ms"] / first["p50_ms"]) / scale if first["p50_ms"] > 0 else None,
        "p99_growth": (last["p99_ms"] / first["p99_ms"]) / scale if first["p99_ms"] > 0 else None,
    }


# ---------------------------------------------------------------------- 2. rpc


def _env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("BANDMASTER_", "DYN_THUNDERAGENT_", "DYN_ROUTER_", "OTEL_"))
    }
    env["PYTHONPATH"] = str(ROOT)
    env["BANDMASTER_LOG_LEVEL"] = "WARNING"
    return env


async def _terminate(proc: asyncio.subprocess.Process) -> None:
    await stop_child_async(proc, 15.0, name="scheduler")


async def bench_rpc(callers: int, duration_s: float, channels: int) -> dict:
    stub = SglangStub(
        sglang_info(
            max_total_num_tokens=50_000_000,
            page_size=16,
            dp_size=8,
            enable_dp_attention=True,
            max_running_requests=100_000,
        )
    )
    await stub.start()
    procs: list[asyncio.subprocess.Process] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            cap_ready, sched_ready = Path(tmp) / "cap.json", Path(tmp) / "sched.json"
            procs.append(
                await asyncio.create_subprocess_exec(
                    *orphan_guard.command(
                        sys.executable,
                        "services.capacity",
                        [
                            "--worker-url",
                            stub.url,
                            "--listen",
                            "127.0.0.1:0",
                            "--metrics-port",
                            "-1",
                            "--ready-file",
                            str(cap_ready),
                            "--poll-interval-seconds",
                            "1",
                            "--poll-timeout-seconds",
                            "1",
                        ],
                    ),
                    cwd=ROOT,
                    env=_env(),
                )
            )
            cap = await wait_ready_file_async(cap_ready, 30)
            if cap is None:
                raise TimeoutError(f"{cap_ready} did not appear")
            procs.append(
                await asyncio.create_subprocess_exec(
                    *orphan_guard.command(
                        sys.executable,
                        "services.scheduler",
                        [
                            "--capacity-addr",
                            cap["grpc"],
                            "--listen",
                            "127.0.0.1:0",
                            "--metrics-port",
                            "-1",
                            "--ready-file",
                            str(sched_ready),
                            "--scheduler-interval-seconds",
                            "1",
                            "--state-path",
                            str(Path(tmp) / "scheduler.sqlite"),
                        ],
                    ),
                    cwd=ROOT,
                    env=_env(),
                )
            )
            sched = await wait_ready_file_async(sched_ready, 30)
            if sched is None:
                raise TimeoutError(f"{sched_ready} did not appear")
            chans = [
                grpc.aio.insecure_channel(sched["grpc"], options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(channels)
            ]
            clients = [pb_grpc.SchedulerStub(c) for c in chans]
            deadline = time.monotonic() + 30
            while True:
                stats = await clients[0].GetStats(pb.GetStatsRequest(), timeout=5)
                if stats.replicas:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError("scheduler never received a capacity snapshot")
                await asyncio.sleep(0.05)
            latencies_ms: list[float] = []
            held = 0
            stop_at = 0.0

            async def caller(i: int) -> None:
                nonlocal held
                client = clients[i % len(clients)]
                sid = f"bench-{i}"
                turn = 0
                while time.monotonic() < stop_at:
                    turn += 1
                    rid = f"{sid}-{turn}"
                    started = time.perf_counter()
                    resp = await client.Admit(
                        pb.AdmitRequest(session_id=sid, request_id=rid, estimated_prompt_tokens=2_000), timeout=30
                    )
                    await client.Complete(
                        pb.CompleteRequest(
                            session_id=sid,
                            request_id=rid,
                            worker_id=resp.worker_id,
                            dp_rank=resp.dp_rank,
                            prompt_tokens=2_000,
                            completion_tokens=200,
                        ),
                        timeout=30,
                    )
                    latencies_ms.append((time.perf_counter() - started) * 1e3)
                    held += resp.was_paused

            # Warm-up (channel set-up, first program creation), then the measured window.
            stop_at = time.monotonic() + min(1.0, duration_s / 4)
            await asyncio.gather(*(caller(i) for i in range(callers)))
            latencies_ms.clear()
            started = time.monotonic()
            stop_at = started + duration_s
            await asyncio.gather(*(caller(i) for i in range(callers)))
            elapsed = time.monotonic() - started
            stats = await clients[0].GetStats(pb.GetStatsRequest(), timeout=5)
            for c in chans:
                await c.close()
            return {
                "callers": callers,
                "channels": channels,
                "duration_s": round(elapsed, 3),
                "round_trips": len(latencies_ms),
                "round_trips_per_s": len(latencies_ms) / elapsed,
                "latency_ms": {
                    "p50": percentile(latencies_ms, 50),
                    "p99": percentile(latencies_ms, 99),
                    "max": max(latencies_ms),
                },
                "held": held,
                "pauses_total": stats.pauses_total,
                "programs": stats.programs_active,
                "replicas": len(stats.replicas),
            }
        finally:
            for proc in reversed(procs):
                await _terminate(proc)
            await stub.stop()


# ---------------------------------------------------------------------- 3. recovery


def _stored_table(programs: int, replicas: int) -> WriteBatch:
    """The tick benchmark's table after a few ticks, as the full batch a scheduler would write."""
    core = SchedulerCore(
        ControlParams(scheduler_interval_seconds=5.0, acting_decay_tau_seconds=30.0), ticket_lease_seconds=30.0
    )
    bench_tick(programs, replicas, ticks=3, core=core)
    clock = SystemClock()
    offset = clock.wall() - clock.monotonic()
    state = durable.export_state(core)
    return WriteBatch(
        {r.session_id: encode_program(r, offset) for r in state.programs},
        {r.request_id: encode_ticket(r, offset) for r in state.tickets},
        encode_meta(state.meta),
        full=True,
    )


async def _time_recovery(make_store, batch: WriteBatch, repeats: int) -> dict:
    store = make_store()
    await store.open()
    await store.load()
    await store.write(batch)
    await store.close()
    runs = []
    for _ in range(repeats):
        store = make_store()
        await store.open()
        core = SchedulerCore(ControlParams(), ticket_lease_seconds=30.0)
        persister = StatePersister(
            core, store, SystemClock(), SchedulerMetrics(CollectorRegistry()), flush_s=1.0, write_timeout_s=10.0
        )
        runs.append(await persister.recover(60.0))
        await store.close()
    runs.sort(key=lambda r: r.seconds)
    median = runs[len(runs) // 2]
    return {
        "recovery_s": round(median.seconds, 4),
        "load_s": round(median.load_s, 4),
        "rebuild_s": round(median.rebuild_s, 4),
        "programs": median.programs,
        "paused": median.paused,
        "tickets": median.tickets,
        "runs_s": [round(r.seconds, 4) for r in runs],
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def bench_recovery(programs: int, replicas: int, repeats: int = 3) -> dict:
    batch = _stored_table(programs, replicas)
    report: dict = {
        "programs": programs,
        "replicas": replicas,
        "stored_bytes": sum(len(v) for v in batch.programs.values() if v),
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.sqlite"
        report["sqlite"] = await _time_recovery(lambda: SqliteStateStore(path), batch, repeats)
        binary = shutil.which("redis-server")
        if binary is None:
            report["redis"] = None  # not installed (make system-deps installs it)
            return report
        port = _free_port()
        server = start_child(
            orphan_guard.exec_command(
                sys.executable,
                binary,
                ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", tmp],
            ),
            None,
        )
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.05)
            url = f"redis://127.0.0.1:{port}/0"
            report["redis"] = await _time_recovery(lambda: RedisStateStore(url, "bench:", 10.0), batch, repeats)
        finally:
            stop_child(server, 10.0, name="redis-server")
    return report


# ---------------------------------------------------------------------- report


def _table(report: dict) -> str:
    from services.launcher.table import render_table

    t, r, s, sc = report["tick"], report["rpc"], report["recovery"], report["tick_scaling"]
    rows = [
        [f"tick ({t['programs']:,} programs, {t['replicas']} replicas)", "p50 ms", t["tick_ms"]["p50"]],
        ["", "p99 ms", t["tick_ms"]["p99"]],
        [
            "",
            "paused / marked / resumed",
            f"{t['activity']['paused']} / {t['activity']['marked']} / {t['activity']['resumed']}",
        ],
        *(
            [
                f"tick scaling ({run['programs']:,} programs)",
                "p50 / p99 ms",
                f"{run['p50_ms']:.1f} / {run['p99_ms']:.1f}",
            ]
            for run in (sc["runs"] if sc else ())
        ),
        *(
            [["", "growth p50 / p99 (1 = linear)", f"{sc['p50_growth']:.2f} / {sc['p99_growth']:.2f}"]]
            if sc and sc["p50_growth"] is not None and sc["p99_growth"] is not None
            else []
        ),
        [f"Admit+Complete ({r['callers']} callers, gRPC)", "round trips/s", r["round_trips_per_s"]],
        ["", "p50 ms", r["latency_ms"]["p50"]],
        ["", "p99 ms", r["latency_ms"]["p99"]],
        ["", "held / pauses", f"{r['held']} / {r['pauses_total']}"],
        [f"recovery ({s['programs']:,} programs)", "SQLite s", s["sqlite"]["recovery_s"]],
        ["", "Redis s", s["redis"]["recovery_s"] if s["redis"] else "not installed"],
    ]
    return render_table(["benchmark", "figure", "value"], rows, title="scheduler benchmark")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scheduler_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/scheduler.json")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    parser.add_argument("--programs", type=int, default=10_000)
    parser.add_argument("--replicas", type=int, default=64)
    parser.add_argument("--ticks", type=int, default=50)
    parser.add_argument(
        "--scaling-programs",
        default="1000,10000,50000",
        help="fleet sizes of the tick scaling run (comma-separated; '' skips it)",
    )
    parser.add_argument("--scaling-ticks", type=int, default=30, help="ticks timed at each scaling size")
    parser.add_argument("--tick-only", action="store_true", help="only the tick and its scaling run (no rpc, recovery)")
    parser.add_argument("--callers", type=int, default=500)
    parser.add_argument("--duration-seconds", type=float, default=10.0)
    parser.add_argument("--channels", type=int, default=4)
    args = parser.parse_args(argv)
    if args.smoke:
        args.programs, args.replicas, args.ticks = 500, 8, 5
        args.callers, args.duration_seconds, args.channels = 20, 1.0, 2
        args.scaling_programs, args.scaling_ticks = "200,1000", 5
    sizes = [int(n) for n in args.scaling_programs.split(",") if n.strip()]
    tick = bench_tick(args.programs, args.replicas, args.ticks)
    scaling = bench_tick_scaling(sizes, args.replicas, args.scaling_ticks) if sizes else None
    if args.tick_only:
        report = {"benchmark": "scheduler", "smoke": args.smoke, "tick": tick, "tick_scaling": scaling}
        print(json.dumps(report, indent=2))
        return 0
    rpc = asyncio.run(bench_rpc(args.callers, args.duration_seconds, args.channels))
    recovery = asyncio.run(bench_recovery(args.programs, args.replicas))
    report = {
        "benchmark": "scheduler",
        "smoke": args.smoke,
        "tick": tick,
        "tick_scaling": scaling,
        "rpc": rpc,
        "recovery": recovery,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(_table(report))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
