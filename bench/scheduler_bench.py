"""Scheduler benchmark: control tick cost at scale, and Admit+Complete round trips over real gRPC.

    python -m bench.scheduler_bench --out bench/results/scheduler.json [--smoke] [--rpc-only] [--attribute]

1. tick: the pure core with 10,000 programs on 64 replicas (mixed sizes, mostly ACTING, some turns
   in flight, enough pressure that pauses, marks and resumes happen), timing `core.tick(now)` while
   a share of programs takes a turn between ticks. Then the same at 1,000 / 10,000 / 50,000 programs
   (`--scaling-programs`): p50 / p99 per size, per program, and their growth against linear; beside the
   wall time, each tick's thread CPU time (`tick_cpu_ms`: on a shared machine the less noisy figure),
   its pauses / resumes / marks (`pauses_resumes_marks_per_tick`) and a digest of every tick's events,
   log lines and resolutions (`decisions_sha256`: two trees decide alike iff they match). Under
   each `--pause-policy` (default both): `cost_aware`, the core the scheduler service runs by default
   (`tick_core`), first, and `threshold`, the reference core the earlier figures were measured with.
   In the scheduler's process settings: `settle_heap` (the collector's, as `python -m services.scheduler`
   applies them) before any table is built, and before each tick, untimed, `settle_if_grown` as the
   service's tick loop calls it (its CPU per settle is reported apart: `heap_settles_cpu_ms`). And what
   each tick's events cost a router process (`router_cache_cpu_ms`): its admission cache, one pinned
   entry per program, fed the events its WatchEvents watcher is sent.
2. rpc: `python -m services.capacity` (one sglang_stub worker with a large KV pool over 8 DP ranks,
   so nothing ever pauses) and `python -m services.scheduler` as subprocesses; N concurrent callers,
   in `--caller-processes` processes of their own (bench/scheduler_callers.py), each loop Admit (or
   AdmitStream, `--admit-stream`) -> Complete for their own program (`--mux`: also, in every round, both
   as operations on one AdmitMux stream per caller process). One round trip = Admit + Complete;
   we report round trips per second, the p50/p99 latency, and from /proc the scheduler's CPU per round
   trip and the cores of the scheduler, the callers and the machine. The scheduler keeps its table in a
   SQLite file (`--store`: or none, or Redis with leader election). `--compare-tree` runs other
   checkouts' schedulers with the same load, interleaved; `--floor` the gRPC floor (bench/grpc_floor.py);
   `--attribute` splits the scheduler's CPU by part of the path (py-spy). Then the memory figures:
   the scheduler's RSS per 10,000 programs (`--memory-programs`), over a soak (`--soak-s`; both over
   AdmitMux with `--mux`, else the round's admission path), and the
   router's per-program state (in this process). docs/scheduler.md, "Admission cost", has the figures.
3. recovery: a table of 10,000 programs (the tick benchmark's, after a few ticks: some paused, some
   turns in flight) stored in SQLite (and in Redis when `redis-server` is installed); the time a
   restarting scheduler takes to load it and rebuild its core (the figure it logs and exports as
   `bandmaster_scheduler_state_recovery_seconds`), median of 3.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import itertools
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import grpc
from prometheus_client import CollectorRegistry

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from bandmaster.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from bench.machine import machine
from bench.rss import rss_trend
from clients.stats import percentile
from services.common.clock import SystemClock
from services.common.process import orphan_guard
from services.common.process.child_start import start_child
from services.common.process.child_stop import stop_child, stop_child_async
from services.common.process.heap import settle_heap, settle_if_grown
from services.common.process.ready import wait_ready_file_async
from services.scheduler.adapters.state_store import (
    RedisStateStore,
    SqliteStateStore,
    WriteBatch,
    encode_meta,
    encode_program,
    encode_ticket,
)
from services.scheduler.core import (
    CapacitySnapshot,
    ControlParams,
    ReplicaCapacity,
    SchedulerCore,
    TickResult,
    Verdict,
    compiled,
    durable,
    make_pause_policy,
)
from services.scheduler.core.defaults import service_control_params
from services.scheduler.metrics import SchedulerMetrics
from services.scheduler.persist import StatePersister
from tests.support.sglang_stub import SglangStub, sglang_info

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------- 1. tick

TICK_POLICIES = ("cost_aware", "threshold")
"""The pause policies the tick is measured under: the service's default first."""
TICK_INTERVAL_S = 5.0


def tick_core(pause_policy: str, *, ticket_lease_seconds: float = 0.0) -> SchedulerCore:
    """The core the tick benchmark times under `pause_policy`.

    cost_aware: built as the scheduler service builds it with no flags (its control defaults,
    program-aware bands and acting decay tau 1 s included, and the policy's default params), at the
    benchmark's 5 s interval. threshold: the pure core's reference policy and bands with tau 30 s,
    the parameters of the figures measured before the benchmark ran the service's policy (kept for
    comparison)."""
    if pause_policy == "cost_aware":
        return SchedulerCore(
            service_control_params("cost_aware", scheduler_interval_seconds=TICK_INTERVAL_S),
            make_pause_policy("cost_aware"),
            ticket_lease_seconds=ticket_lease_seconds,
        )
    if pause_policy == "threshold":
        return SchedulerCore(
            ControlParams(scheduler_interval_seconds=TICK_INTERVAL_S, acting_decay_tau_seconds=30.0),
            make_pause_policy("threshold"),
            ticket_lease_seconds=ticket_lease_seconds,
        )
    raise ValueError(f"pause_policy must be one of {', '.join(TICK_POLICIES)}, got {pause_policy!r}")


def _core_name() -> str:
    """Which scheduler core this process runs, as the reports name it."""
    return "compiled" if compiled() else "pure Python"


def bench_tick(
    programs: int,
    replicas: int,
    ticks: int,
    seed: int = 7,
    core: SchedulerCore | None = None,
    pause_policy: str = "cost_aware",
    tick: Callable[[float], TickResult] | None = None,
) -> dict:
    """The mix; `tick`, if given, is called in place of `core.tick` (to time or gate each tick: a
    compiled core's methods cannot be replaced)."""
    rng = random.Random(seed)
    core = core or tick_core(pause_policy)
    run_tick = tick or core.tick
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
    cpu_ms: list[float] = []  # the tick's thread CPU time: on a shared machine, less noisy than wall time
    per_tick: list[list[int]] = []  # pauses / resumes / marks of each tick
    # What each tick's events cost a router process: its admission cache holding one entry per program
    # (pinned where the scheduler placed it), fed the events as its WatchEvents watcher feeds them.
    from services.router.core.admission_cache import IGNORED_EVENTS

    router_cache, pinned = _router_cache([f"p{i}" for i in range(programs)])
    router_ms: list[float] = []
    events_per_tick: list[int] = []
    settles_ms: list[float] = []  # CPU of each heap settle before a tick (the table grew: heap.settle_if_grown)
    decisions = hashlib.sha256()  # every tick's events, log lines and resolutions, in order
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
        # As the service's tick loop does before each tick (`SchedulerRuntime._settle_heap`), untimed: it is
        # the loop's, not the tick's, and its cost is reported apart.
        settle_started = time.thread_time_ns()
        if settle_if_grown(len(core.ledger.programs)):
            settles_ms.append((time.thread_time_ns() - settle_started) / 1e6)
        started, cpu_started = time.perf_counter(), time.thread_time_ns()
        ticked = run_tick(now)
        cpu_ms.append((time.thread_time_ns() - cpu_started) / 1e6)
        durations_ms.append((time.perf_counter() - started) * 1e3)
        per_tick.append([ticked.paused, ticked.resumed, ticked.marked])
        watched = [(e.kind.value, e.session_id) for e in ticked.events if e.kind.value not in IGNORED_EVENTS]
        events_per_tick.append(len(watched))
        cpu_started = time.thread_time_ns()
        for kind, sid in watched:
            router_cache.event(kind, sid)
        router_ms.append((time.thread_time_ns() - cpu_started) / 1e6)
        for _, sid in watched:  # their next admissions store them again (untimed)
            router_cache.put(now, sid, router_cache.begin(), pinned(int(sid[1:])), was_paused=False)
        decisions.update(repr((ticked.events, ticked.logs, ticked.resolutions)).encode())
        for key in totals:
            totals[key] += getattr(ticked, key)
    stats = core.stats(now)
    return {
        "scheduler_core": _core_name(),
        "pause_policy": core.policy.name,
        "acting_decay_tau_seconds": core.params.acting_decay_tau_seconds,
        "programs": programs,
        "replicas": replicas,
        "ticks": ticks,
        "retention_tokens_per_replica": per_replica,
        "tick_ms": _spread(durations_ms),
        "tick_cpu_ms": _spread(cpu_ms),
        "tick_cpu_ms_each": cpu_ms,
        "heap_settles_cpu_ms": settles_ms,
        "router_cache_cpu_ms": {
            **_spread(router_ms),
            "watched_events_per_tick_mean": sum(events_per_tick) / len(events_per_tick),
        },
        "pauses_resumes_marks_per_tick": per_tick,
        "decisions_sha256": decisions.hexdigest(),
        "activity": {**totals, "paused_now": stats.programs_paused, "waiting_admissions": stats.waiting_admissions},
    }


def _spread(values: list[float]) -> dict:
    return {
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "max": max(values),
        "mean": sum(values) / len(values),
    }


def _router_cache(sids: list[str]):
    """A router's live admission cache holding an entry for each of `sids`, each pinned on one of 8
    replicas, and the function that gives program i's entry (to store it again)."""
    from services.router.core.admission_cache import AdmissionCache, CachedAdmission, CacheParams

    def pinned(i: int) -> CachedAdmission:
        return CachedAdmission(f"w{i % 8}", i % 8, True, 0)

    cache = AdmissionCache(CacheParams(max_entries=max(len(sids), CacheParams().max_entries)))
    cache.connected()
    for i, sid in enumerate(sids):
        cache.put(0.0, sid, cache.begin(), pinned(i), was_paused=False)
    return cache, pinned


def bench_tick_phases(programs: int, replicas: int, ticks: int, pause_policy: str = "cost_aware") -> dict:
    """The tick benchmark's mix with the tick split by part: each planner (`ControlLaw.plan_*`), the
    application of each plan (the transitions: state change, re-accounting, events, log records),
    idle expiry, the replica stats, and the time the garbage collector ran inside ticks (counted in
    the part it interrupted too). Milliseconds per tick, means over the run."""
    core = tick_core(pause_policy)
    spent: dict[str, float] = {}
    planned: dict[int, str] = {}  # id(plan) -> its planner, so that its application is told apart

    def timed(name: str, fn, record_plan: bool = False):
        def run(*args, **kwargs):
            started = time.perf_counter()
            try:
                result = fn(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - started
            if record_plan:
                planned[id(result)] = name
            return result

        return run

    for name in ("plan_resume", "plan_aging", "plan_forced", "plan_pauses"):
        setattr(core.control, name, timed(name, getattr(core.control, name), record_plan=True))
    # The soft demote is planned and applied in one pass (`SchedulerCore._soft_demote`): one part.
    core._soft_demote = timed("soft_demote", core._soft_demote)  # type: ignore[method-assign]
    apply = core._apply

    def apply_timed(now, plan, acc):
        return timed("apply " + planned.pop(id(plan), "other").removeprefix("plan_"), apply)(now, plan, acc)

    core._apply = apply_timed  # type: ignore[method-assign]
    core._expire_idle = timed("expire_idle", core._expire_idle)  # type: ignore[method-assign]
    core.replica_stats = timed("replica_stats", core.replica_stats)  # type: ignore[method-assign]
    tick = core.tick
    in_tick = [False]
    gc_started = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if not in_tick[0]:
            return
        if phase == "start":
            gc_started[0] = time.perf_counter()
        else:
            key = f"gc (generation {info['generation']})"
            spent[key] = spent.get(key, 0.0) + time.perf_counter() - gc_started[0]

    def tick_timed(now, snapshot=None):
        in_tick[0] = True
        try:
            return timed("tick", tick)(now, snapshot)
        finally:
            in_tick[0] = False

    core.tick = tick_timed  # type: ignore[method-assign]
    gc.callbacks.append(on_gc)
    try:
        run = bench_tick(programs, replicas, ticks, core=core)
    finally:
        gc.callbacks.remove(on_gc)
    return {
        "scheduler_core": _core_name(),
        "pause_policy": pause_policy,
        "programs": programs,
        "ticks": ticks,
        "tick_ms": run["tick_ms"],
        "ms_per_tick": {k: v * 1e3 / ticks for k, v in sorted(spent.items(), key=lambda kv: -kv[1])},
        "activity": run["activity"],
    }


def bench_tick_phases_pure(programs: int, replicas: int, ticks: int, pause_policy: str = "cost_aware") -> dict:
    """`bench_tick_phases` on the pure Python core: it times the parts by replacing the core's methods,
    which a compiled core does not allow, so with the compiled core loaded it runs in a process of its
    own that loads the pure one (BANDMASTER_PURE_CORE; the report's `scheduler_core` says which ran)."""
    if not compiled():
        return bench_tick_phases(programs, replicas, ticks, pause_policy)
    program = (
        "import json, sys\n"
        "from bench.scheduler_bench import bench_tick_phases, settle_heap\n"
        "settle_heap()\n"
        f"print(json.dumps(bench_tick_phases({programs}, {replicas}, {ticks}, {pause_policy!r})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        env={**os.environ, "BANDMASTER_PURE_CORE": "1"},
        capture_output=True,
        text=True,
        timeout=1800,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_tick_scaling(sizes: list[int], replicas: int, ticks: int, pause_policy: str = "cost_aware") -> dict:
    """The tick benchmark at each fleet size (the same mix, the budget scaled with the programs): its
    p50 / p99 and their cost per program, and how the cost grows from the smallest size to the largest
    relative to the programs (growth 1.0 = linear; above it, superlinear)."""
    runs = []
    for programs in sizes:
        run = bench_tick(programs, replicas, ticks, pause_policy=pause_policy)
        p50, p99 = run["tick_ms"]["p50"], run["tick_ms"]["p99"]
        runs.append(
            {
                "programs": programs,
                "p50_ms": p50,
                "p99_ms": p99,
                "cpu_p50_ms": run["tick_cpu_ms"]["p50"],
                "cpu_p99_ms": run["tick_cpu_ms"]["p99"],
                "decisions_sha256": run["decisions_sha256"],
                "p50_us_per_program": p50 * 1e3 / programs,
                "p99_us_per_program": p99 * 1e3 / programs,
                "activity": run["activity"],
            }
        )
    first, last = runs[0], runs[-1]
    scale = last["programs"] / first["programs"]
    return {
        "pause_policy": pause_policy,
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


CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_sample(pid: int) -> dict:
    """CPU seconds (user + system) and resident memory (VmRSS, VmHWM, in KiB) of a process, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu_s = (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15 of stat)
    mem = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":", 1)
                mem[key] = int(value.split()[0])
    return {"cpu_s": cpu_s, "rss_kb": mem.get("VmRSS", 0), "hwm_kb": mem.get("VmHWM", 0)}


def _machine_busy_s() -> float:
    """CPU seconds all cores spent not idle since boot (from /proc/stat), to show the machine's load."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values[:8]) - idle) / CLK_TCK


NATIVE_LOOP = "gRPC C core + cython glue + event loop (native, under the loop)"
ATTRIBUTION = (
    # (part, file fragments), as py-spy names a frame's file (relative to its sys.path entry: OpenTelemetry's
    # `opentelemetry/sdk/trace/__init__.py` is `trace/__init__.py`, its gRPC instrumentation `grpc/_aio_server.py`).
    # A sample counts for the part of its innermost frame that matches one (frames of no part, such as
    # contextlib or asyncio.timeout called from the servicer, count for their caller's part).
    ("decision (scheduler core)", ("services/scheduler/core/",)),
    (
        "tracing (OpenTelemetry spans, context, interceptor)",
        (
            "trace/",
            "_decorator.py",
            "attributes/",
            "context/",
            "propagate/",
            "composite.py",
            "textmap.py",
            "baggage/",
            "grpc/_aio_server.py",
            "grpc/_server.py",
            "services/common/observe/telemetry.py",
            "services/common/observe/trace_export.py",
        ),
    ),
    ("metrics (prometheus_client)", ("prometheus_client/",)),
    ("durable write-through (persist, store)", ("services/scheduler/persist.py", "state_store", "sqlite3", "redis/")),
    ("servicer shell (validation, conversion, runtime, guards)", ("services/scheduler/", "services/common/")),
    ("gRPC poller thread (native)", ("threading.py",)),
    (NATIVE_LOOP, ("uvloop/", "asyncio/runners.py")),
)


def attribute_stacks(collapsed: str) -> dict:
    """Split py-spy `--format raw` samples (`frame;frame;... count` per line, outermost frame first) into the
    parts of ATTRIBUTION: the share of the scheduler's on-CPU samples each part took."""
    counts: dict[str, int] = {}
    total = 0
    for line in collapsed.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        total += int(n)
        part = "other (GC, interpreter)"
        for frame in reversed(stack.split(";")):
            hit = next((name for name, frags in ATTRIBUTION if any(f in frame for f in frags)), None)
            if hit is not None:
                part = hit
                break
        counts[part] = counts.get(part, 0) + int(n)
    return {
        "samples": total,
        "share": {k: round(v / total, 4) for k, v in sorted(counts.items(), key=lambda kv: -kv[1])} if total else {},
    }


def _py_spy(path: str | None) -> str | None:
    for candidate in (path, shutil.which("py-spy"), "/tmp/spyenv/bin/py-spy"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


async def _start_guarded(
    module: str, args: list[str], ready: Path, *, cwd: Path = ROOT, env: dict | None = None, timeout_s: float = 60
) -> tuple[asyncio.subprocess.Process, str]:
    """`python -m module args` under the orphan guard; its gRPC address from `ready` (terminated, and
    TimeoutError, when the ready file does not appear within `timeout_s`)."""
    proc = await asyncio.create_subprocess_exec(
        *orphan_guard.command(sys.executable, module, args), cwd=cwd, env=_env() if env is None else env
    )
    answer = await wait_ready_file_async(ready, timeout_s)
    if answer is None:
        await _terminate(proc)
        raise TimeoutError(f"{ready} did not appear")
    return proc, answer["grpc"]


async def _start_capacity(stub_url: str, tmp: Path) -> tuple[asyncio.subprocess.Process, str]:
    ready = tmp / "cap.json"
    return await _start_guarded(
        "services.capacity",
        [
            "--worker-url",
            stub_url,
            "--listen",
            "127.0.0.1:0",
            "--metrics-port",
            "-1",
            "--ready-file",
            str(ready),
            "--poll-interval-seconds",
            "1",
            "--poll-timeout-seconds",
            "1",
        ],
        ready,
        timeout_s=30,
    )


async def _start_scheduler(
    tree: Path | None, cap_addr: str, tmp: Path, tag: str, store: str, redis_url: str
) -> tuple[asyncio.subprocess.Process, str]:
    """`python -m services.scheduler` from `tree` (this checkout, or another one to compare against); tree
    None: the gRPC floor (bench.grpc_floor, empty answers)."""
    ready = tmp / f"sched-{tag}.json"
    if tree is None:
        return await _start_guarded("bench.grpc_floor", ["--ready-file", str(ready)], ready)
    args = [
        "--capacity-addr",
        cap_addr,
        "--listen",
        "127.0.0.1:0",
        "--metrics-port",
        "-1",
        "--ready-file",
        str(ready),
        "--scheduler-interval-seconds",
        "1",
    ]
    if store == "sqlite":
        args += ["--state-path", str(tmp / f"scheduler-{tag}.sqlite")]
    elif store == "redis":
        args += ["--state-redis-url", redis_url, "--state-redis-prefix", f"bench:{tag}:", "--leader-election"]
    else:
        args += ["--state-path", "none"]
    env = _env()
    env["PYTHONPATH"] = str(tree)
    return await _start_guarded("services.scheduler", args, ready, cwd=tree, env=env)


async def _wait_capacity(addr: str) -> None:
    async with grpc.aio.insecure_channel(addr) as chan:
        client = pb_grpc.SchedulerStub(chan)
        deadline = time.monotonic() + 30
        while True:
            try:
                stats = await client.GetStats(pb.GetStatsRequest(), timeout=5)
                if stats.replicas:
                    return
            except grpc.aio.AioRpcError as exc:  # a standby during its first election
                if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
                    raise
            if time.monotonic() > deadline:
                raise TimeoutError("scheduler never received a capacity snapshot (or never led)")
            await asyncio.sleep(0.05)


async def _stats(addr: str) -> pb.Stats:
    async with grpc.aio.insecure_channel(addr) as chan:
        return await pb_grpc.SchedulerStub(chan).GetStats(pb.GetStatsRequest(), timeout=5)


async def run_callers(
    addr: str,
    sched_pid: int,
    *,
    callers: int,
    caller_procs: int,
    channels: int,
    warmup_s: float,
    duration_s: float,
    sessions: int = 0,
    once: bool = False,
    path: str = "Admit",
    profile_out: Path | None = None,
    py_spy: str | None = None,
) -> dict:
    """Start `caller_procs` processes of bench.scheduler_callers sharing `callers`, run them, and measure the
    scheduler's CPU over the measured window (and the callers' own CPU, and the whole machine's)."""
    result_dir = Path(tempfile.mkdtemp(prefix="sched-callers-"))
    share = [callers // caller_procs + (1 if k < callers % caller_procs else 0) for k in range(caller_procs)]
    procs: list[asyncio.subprocess.Process] = []
    first = 0
    for count in share:
        argv = ["--addr", addr, "--first", str(first), "--count", str(count), "--total-callers", str(callers)]
        argv += ["--result-file", str(result_dir / f"callers-{len(procs)}.json")]
        argv += ["--channels", str(max(1, channels // caller_procs))]
        if sessions:
            argv += ["--sessions", str(sessions)]
        if once:
            argv.append("--once")
        if path == "AdmitStream":
            argv.append("--stream")
        elif path == "AdmitMux":
            argv.append("--mux")
        procs.append(
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bench.scheduler_callers",
                *argv,
                cwd=ROOT,
                env=_env(),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        )
        first += count
    try:
        for p in procs:
            assert p.stdout is not None
            line = await asyncio.wait_for(p.stdout.readline(), 60)
            if line.strip() != b"ready":
                raise RuntimeError(f"a caller process did not start: {line!r}")
        now = time.time()
        warmup_until = now + warmup_s
        stop_at = warmup_until + (duration_s if not once else 3600.0)
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(f"GO {warmup_until} {stop_at}\n".encode())
            await p.stdin.drain()
        await asyncio.sleep(max(0.0, warmup_until - time.time()))
        spy = None
        if profile_out is not None and py_spy is not None:
            spy = await asyncio.create_subprocess_exec(
                py_spy,
                "record",
                "--pid",
                str(sched_pid),
                "--rate",
                "200",
                "--duration",
                str(max(1, int(duration_s))),
                "--format",
                "raw",
                "--nonblocking",
                "--output",
                str(profile_out),
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
        before = proc_sample(sched_pid)
        callers_before = [proc_sample(p.pid)["cpu_s"] for p in procs]
        busy_before, wall_before = _machine_busy_s(), time.monotonic()
        waiting = asyncio.gather(*(p.communicate() for p in procs))
        if not once:
            # Sampled at stop_at: the callers stop starting round trips then (the ones under way finish).
            await asyncio.sleep(max(0.0, stop_at - time.time()))
            callers_after = [proc_sample(p.pid)["cpu_s"] if p.returncode is None else 0.0 for p in procs]
            busy_after = _machine_busy_s()
        outputs = await waiting
        if once:
            callers_after = callers_before
            busy_after = _machine_busy_s()
        ended = time.monotonic()
        # After the round trips under way at stop_at ended: every counted round trip's CPU is in.
        after = proc_sample(sched_pid)
        if spy is not None:
            await spy.wait()
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
                await p.wait()
    try:
        for p, (_, err) in zip(procs, outputs):
            if p.returncode != 0:
                raise RuntimeError(f"a caller process failed ({p.returncode}): {err.decode()[-2000:]}")
        results = [json.loads((result_dir / f"callers-{k}.json").read_text()) for k in range(len(procs))]
    finally:
        shutil.rmtree(result_dir, ignore_errors=True)
    latencies = [x for r in results for x in r["latencies_ms"]]
    elapsed = ended - wall_before if once else duration_s
    trips = len(latencies)
    sched_cpu = after["cpu_s"] - before["cpu_s"]
    return {
        "path": path,
        "callers": callers,
        "caller_processes": caller_procs,
        "channels": channels,
        "duration_s": round(elapsed, 3),
        "round_trips": trips,
        "round_trips_per_s": trips / elapsed if elapsed > 0 else 0.0,
        "latency_ms": {
            "p50": percentile(latencies, 50) if latencies else None,
            "p99": percentile(latencies, 99) if latencies else None,
            "max": max(latencies) if latencies else None,
        },
        "errors": sum(r["errors"] for r in results),
        "held": sum(r["held"] for r in results),
        "scheduler_cpu": {
            "cores": round(sched_cpu / elapsed, 3) if elapsed > 0 else None,
            "us_per_round_trip": round(sched_cpu / trips * 1e6, 1) if trips else None,
        },
        "callers_cpu_cores": round(sum(a - b for a, b in zip(callers_after, callers_before)) / elapsed, 3)
        if elapsed > 0
        else None,
        "machine_busy_cores": round((busy_after - busy_before) / elapsed, 2) if elapsed > 0 else None,
        "scheduler_rss_kb": after["rss_kb"],
    }


async def bench_rpc(
    callers: int,
    duration_s: float,
    channels: int,
    *,
    caller_procs: int = 2,
    trees: tuple[tuple[str, Path | None], ...] = (("this", ROOT),),
    rounds: int = 1,
    store: str = "sqlite",
    memory_programs: int = 10_000,
    soak_s: float = 0.0,
    attribute: bool = False,
    py_spy_path: str | None = None,
    profile_dir: Path | None = None,
    stream: bool = False,
    mux: bool = False,
) -> dict:
    """Admit+Complete from `callers` callers (in `caller_procs` processes of their own) against each tree's
    scheduler in turn, `rounds` times interleaved; the first tree's first round is the headline figure.
    `mux`: each tree also runs with AdmitMux (one stream per caller process) right after AdmitStream, on a
    fresh scheduler, in every round; `summary` has the medians over the rounds per tree and path."""
    paths = ("AdmitStream", "AdmitMux") if mux else ("AdmitStream" if stream else "Admit",)
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
    py_spy = _py_spy(py_spy_path) if attribute else None
    report: dict = {"store": store, "admit_rpc": paths[0], "runs": []}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        cap_proc = None
        redis = None
        try:
            redis_url = ""
            if store == "redis":
                redis, redis_url = await _start_redis(tmp)
            cap_proc, cap_addr = await _start_capacity(stub.url, tmp)
            for round_no, (name, tree), path in itertools.product(range(rounds), trees, paths):
                if tree is None and path == "AdmitMux":
                    continue  # the floor (bench.grpc_floor) answers the unary and AdmitStream calls only
                tag = f"{name}-{round_no}-{path}"
                proc, addr = await _start_scheduler(tree, cap_addr, tmp, tag, store, redis_url)
                try:
                    await _wait_capacity(addr)
                    run: dict = {"tree": name, "round": round_no, "path": path}
                    idle = proc_sample(proc.pid)
                    profile = (profile_dir or tmp) / f"scheduler-{tag}.spy" if py_spy else None
                    run["rpc"] = await run_callers(
                        addr,
                        proc.pid,
                        callers=callers,
                        caller_procs=caller_procs,
                        channels=channels,
                        warmup_s=min(1.0, duration_s / 4),
                        duration_s=duration_s,
                        profile_out=profile,
                        py_spy=py_spy,
                        path=path,
                    )
                    stats = await _stats(addr)
                    if tree is None:
                        report["runs"].append(run)
                        continue
                    run["rpc"]["pauses_total"] = stats.pauses_total
                    run["rpc"]["programs"] = stats.programs_active
                    run["rpc"]["replicas"] = len(stats.replicas)
                    if profile is not None and profile.exists():
                        run["attribution"] = attribute_stacks(profile.read_text())
                    if round_no == 0 and path == paths[-1] and memory_programs:
                        run["memory"] = await _memory(
                            addr, proc.pid, idle, callers, caller_procs, channels, memory_programs, soak_s, path
                        )
                    report["runs"].append(run)
                finally:
                    await _terminate(proc)
        finally:
            if cap_proc is not None:
                await _terminate(cap_proc)
            if redis is not None:
                stop_child(redis, 10.0, name="redis-server")
            await stub.stop()
    report["summary"] = rpc_summary(report["runs"])
    head = report["runs"][0]
    report.update(head["rpc"])  # the headline figures at the top level, as before
    if memory := next((r["memory"] for r in report["runs"] if "memory" in r), None):
        report["memory"] = memory
    if "attribution" in head:
        report["attribution"] = head["attribution"]
    return report


def rpc_summary(runs: list[dict]) -> list[dict]:
    """Per tree and admission path, the medians over the rounds of round trips/s, p50, p99 and the
    scheduler's CPU per round trip (the interleaved rounds share the machine's drift)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for run in runs:
        groups.setdefault((run["tree"], run.get("path", "Admit")), []).append(run["rpc"])
    out = []
    for (tree, path), rpcs in groups.items():

        def med(values: list) -> float | None:
            present = [v for v in values if v is not None]
            return round(statistics.median(present), 1) if present else None

        out.append(
            {
                "tree": tree,
                "path": path,
                "rounds": len(rpcs),
                "round_trips_per_s": med([r["round_trips_per_s"] for r in rpcs]),
                "p50_ms": med([r["latency_ms"]["p50"] for r in rpcs]),
                "p99_ms": med([r["latency_ms"]["p99"] for r in rpcs]),
                "scheduler_us_per_round_trip": med([r["scheduler_cpu"]["us_per_round_trip"] for r in rpcs]),
                "scheduler_cores": med([r["scheduler_cpu"]["cores"] for r in rpcs]),
                "errors": sum(r["errors"] for r in rpcs),
            }
        )
    return out


async def _memory(
    addr: str,
    pid: int,
    idle: dict,
    callers: int,
    caller_procs: int,
    channels: int,
    programs: int,
    soak_s: float,
    path: str = "Admit",
) -> dict:
    """The scheduler's resident memory with `programs` programs in its table (each took one turn), and per
    10,000 programs (the growth over the load, per program it added); with `soak_s`, Admit+Complete cycling
    over those programs for that long while RSS is sampled (flat = no growth per turn). Both over `path`
    (the last admission path the run measures: AdmitMux with `--mux`)."""
    before = proc_sample(pid)
    programs_before = (await _stats(addr)).programs_active
    load = await run_callers(
        addr,
        pid,
        callers=callers,
        caller_procs=caller_procs,
        channels=channels,
        warmup_s=0.0,
        duration_s=0.0,
        sessions=programs,
        once=True,
        path=path,
    )
    loaded = proc_sample(pid)
    stats = await _stats(addr)
    report: dict = {
        "path": path,
        "idle_rss_kb": idle["rss_kb"],
        "before_load_rss_kb": before["rss_kb"],
        "programs": stats.programs_active,
        "loaded_rss_kb": loaded["rss_kb"],
        "loaded_hwm_kb": loaded["hwm_kb"],
        "load_errors": load["errors"],
        "programs_before_load": programs_before,
        # The growth over the load alone: the rpc run before it grew the process too (gRPC buffers, allocator
        # arenas for 500 concurrent calls), which is not per program.
        "rss_kb_per_10k_programs": round(
            (loaded["rss_kb"] - before["rss_kb"]) * 10_000 / max(1, stats.programs_active - programs_before)
        ),
        "soak": None,
    }
    if soak_s > 0:
        samples: list[dict] = []
        interval = max(1.0, soak_s / 20)
        t0 = time.monotonic()

        async def sample() -> None:
            while True:
                samples.append({"t_s": round(time.monotonic() - t0, 1), **proc_sample(pid)})
                await asyncio.sleep(interval)

        sampler = asyncio.create_task(sample())
        try:
            soak = await run_callers(
                addr,
                pid,
                callers=callers,
                caller_procs=caller_procs,
                channels=channels,
                warmup_s=0.0,
                duration_s=soak_s,
                sessions=programs,
                path=path,
            )
        finally:
            sampler.cancel()
        samples.append({"t_s": round(time.monotonic() - t0, 1), **proc_sample(pid)})
        rss = [s["rss_kb"] for s in samples]
        # The trend after the first tenth (the first calls on every program warm buffers and arenas up).
        trend = rss_trend([(s["t_s"], s["rss_kb"]) for s in samples], soak_s / 10)
        report["soak"] = {
            "rss_kb_slope_per_min": trend["rss_kb_slope_per_min"],
            "rss_kb_median_first_half": trend["rss_kb_median_first_half"],
            "rss_kb_median_second_half": trend["rss_kb_median_second_half"],
            "rss_kb_band_settled": trend["rss_kb_band_settled"],
            "seconds": soak_s,
            "round_trips": soak["round_trips"],
            "round_trips_per_s": soak["round_trips_per_s"],
            "rss_kb_first": rss[0],
            "rss_kb_last": rss[-1],
            "rss_kb_max": max(rss),
            "rss_growth_kb": rss[-1] - rss[0],
            "samples": [{"t_s": s["t_s"], "rss_kb": s["rss_kb"]} for s in samples],
        }
    return report


def bench_router_state(programs: int, prompt_chars: int = 8_000) -> dict:
    """The router's per-program state with `programs` programs, in this process (tracemalloc): its admission
    cache (one entry each), its client limits (programs over 50 clients), its session chains (each
    program's last prompt, `prompt_chars` characters, hashed in the router's default text chunks) and its
    prefix index (approximate mode: one routing record per turn, each prompt's chain, over 8 replicas,
    kept `router_ttl_s`). The cache, the chains and the index are bounded by the router's settings
    (`CacheParams.max_entries`, `session_chain_bytes`, `max_blocks_per_worker` and the TTL): past them it
    evicts, so this is the figure below the bounds, and the bound above.

    Not the router process's RSS: a router needs a whole stack to hold programs; its per-program state is
    these three structures (services/router/core), built here as the router builds them."""
    import tracemalloc

    from services.router.core.admission_cache import CacheParams
    from services.router.core.hashing import text_chunk_hashes
    from services.router.core.index import RoutingHistoryIndex
    from services.router.core.limits import ClientLimitParams, ClientLimits
    from services.router.core.params import KvRouterParams
    from services.router.core.session_chains import SessionChains
    from services.router.core.types import Replica

    defaults = KvRouterParams()
    rng = random.Random(11)
    prefix = rng.randbytes(prompt_chars // 4).hex()  # a shared system prompt, half of each prompt
    sids = [f"program-{i}" for i in range(programs)]
    parts: dict[str, int] = {}
    tracemalloc.start()
    try:
        mark, _ = tracemalloc.get_traced_memory()
        cache, _ = _router_cache(sids)
        now, _ = tracemalloc.get_traced_memory()
        parts["admission_cache"], mark = now - mark, now
        limits = ClientLimits(ClientLimitParams(max_programs=0, new_programs_per_s=0.0))
        for i, sid in enumerate(sids):
            limits.admit(f"client-{i % 50}", sid, 0.0)
        now, _ = tracemalloc.get_traced_memory()
        parts["client_limits"], mark = now - mark, now
        chains = SessionChains(defaults.session_chain_bytes)
        prompts_from = rng.getstate()
        for sid in sids:
            chains.text_ids(sid, prefix + rng.randbytes(prompt_chars // 4).hex(), defaults.text_chunk_chars)
        now, _ = tracemalloc.get_traced_memory()
        parts["session_chains"], mark = now - mark, now
        index = RoutingHistoryIndex(
            ttl_s=defaults.router_ttl_s,
            max_blocks_per_worker=defaults.max_blocks_per_worker,
            prune_target_ratio=defaults.prune_target_ratio,
        )
        replicas = [Replica(f"w{i}", 0) for i in range(8)]
        rng.setstate(prompts_from)  # the same prompts again: the router records each turn's chain of ids
        for i in range(programs):
            prompt = prefix + rng.randbytes(prompt_chars // 4).hex()
            index.record(replicas[i % 8], tuple(text_chunk_hashes(prompt, defaults.text_chunk_chars)), 0.0)
        now, _ = tracemalloc.get_traced_memory()
        parts["routing_history_index"] = now - mark
    finally:
        tracemalloc.stop()
    kept = {
        "admission_cache": len(cache),
        "client_limits": programs,
        "session_chains": len(chains),
        "routing_history_index": programs,
    }
    # Per program kept, times 10,000: what 10,000 programs take below the bounds.
    per_10k = {k: round(v * 10_000 / max(1, kept[k])) for k, v in parts.items()}
    return {
        "programs": programs,
        "prompt_chars": prompt_chars,
        "bytes_per_10k_programs": per_10k,
        "programs_kept": kept,
        "session_chain_bytes_bound": defaults.session_chain_bytes,
        "admission_cache_entries_bound": CacheParams().max_entries,
    }


# ---------------------------------------------------------------------- 3. recovery


def _stored_table(programs: int, replicas: int) -> WriteBatch:
    """The tick benchmark's table after a few ticks, as the full batch a scheduler would write."""
    core = tick_core("threshold", ticket_lease_seconds=30.0)
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


async def _start_redis(tmp: Path):
    """A throwaway redis-server on a free loopback port (no persistence): the child and its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (make system-deps installs it)")
    port = _free_port()
    server = start_child(
        orphan_guard.exec_command(
            sys.executable,
            binary,
            ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp)],
        ),
        None,
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return server, f"redis://127.0.0.1:{port}/0"
        except OSError:
            if time.monotonic() > deadline:
                stop_child(server, 10.0, name="redis-server")
                raise
            await asyncio.sleep(0.05)


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
        server, url = await _start_redis(Path(tmp))
        try:
            report["redis"] = await _time_recovery(lambda: RedisStateStore(url, "bench:", 10.0), batch, repeats)
        finally:
            stop_child(server, 10.0, name="redis-server")
    return report


# ---------------------------------------------------------------------- report


def _tick_rows(policy: str, t: dict, sc: dict | None) -> list[list]:
    return [
        [f"tick, {policy} ({t['programs']:,} programs, {t['replicas']} replicas)", "p50 ms", t["tick_ms"]["p50"]],
        ["", "p99 ms", t["tick_ms"]["p99"]],
        ["", "CPU p50 / p99 ms", f"{t['tick_cpu_ms']['p50']:.1f} / {t['tick_cpu_ms']['p99']:.1f}"],
        [
            "",
            "a router's cache: events / CPU p99 ms",
            f"{t['router_cache_cpu_ms']['watched_events_per_tick_mean']:.0f} / {t['router_cache_cpu_ms']['p99']:.2f}",
        ],
        [
            "",
            "paused / marked / resumed",
            f"{t['activity']['paused']} / {t['activity']['marked']} / {t['activity']['resumed']}",
        ],
        *(
            [
                f"tick scaling, {policy} ({run['programs']:,} programs)",
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
    ]


def _table(report: dict) -> str:
    from services.launcher.table import render_table

    r, s = report["rpc"], report["recovery"]
    rows = [
        row
        for tick_run in report["tick_runs"]
        for row in _tick_rows(tick_run["pause_policy"], tick_run["tick"], tick_run["tick_scaling"])
    ]
    rows += [
        [f"Admit+Complete ({r['callers']} callers, gRPC)", "round trips/s", r["round_trips_per_s"]],
        ["", "p50 ms", r["latency_ms"]["p50"]],
        ["", "p99 ms", r["latency_ms"]["p99"]],
        ["", "held / pauses", f"{r['held']} / {r['pauses_total']}"],
        ["", "scheduler CPU µs / round trip", r["scheduler_cpu"]["us_per_round_trip"]],
        [
            "",
            "scheduler / callers / machine cores",
            f"{r['scheduler_cpu']['cores']} / {r['callers_cpu_cores']} / {r['machine_busy_cores']}",
        ],
        *(
            [
                [
                    f"Admit+Complete, tree {run['tree']} round {run['round']} {run.get('path', '')}",
                    "round trips/s, p99 ms, µs CPU",
                    f"{run['rpc']['round_trips_per_s']:.0f}, {run['rpc']['latency_ms']['p99']:.0f}, "
                    f"{run['rpc']['scheduler_cpu']['us_per_round_trip']}",
                ]
                for run in r["runs"][1:]
            ]
        ),
        *(
            [
                [
                    f"scheduler memory ({m['programs']:,} programs)",
                    "RSS MiB idle / loaded",
                    f"{m['idle_rss_kb'] / 1024:.0f} / {m['loaded_rss_kb'] / 1024:.0f}",
                ],
                ["", "RSS MiB per 10,000 programs", f"{m['rss_kb_per_10k_programs'] / 1024:.1f}"],
            ]
            if (m := r.get("memory"))
            else []
        ),
        *(
            [
                [
                    f"router per-program state ({rs['prompt_chars']:,}-char prompts)",
                    f"MiB per 10,000 programs: {part}",
                    f"{size / 2**20:.1f}",
                ]
                for part, size in rs["bytes_per_10k_programs"].items()
            ]
            if (rs := report.get("router_state"))
            else []
        ),
        *(
            [["", f"soak {m['soak']['seconds']:g}s: RSS growth MiB", f"{m['soak']['rss_growth_kb'] / 1024:.1f}"]]
            if (m := r.get("memory")) and m["soak"]
            else []
        ),
        *(
            [
                ["attribution (scheduler CPU share)", part, f"{share:.0%}"]
                for part, share in r["attribution"]["share"].items()
            ]
            if r.get("attribution")
            else []
        ),
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
    parser.add_argument(
        "--pause-policy",
        choices=(*TICK_POLICIES, "both"),
        default="both",
        help="the core the tick parts time: cost_aware (the scheduler service's, built as it builds it), "
        "threshold (the reference policy and bands the earlier figures used) or both (cost_aware first: "
        "`tick`, `tick_scaling` and `tick_phases` are its runs, `tick_runs` has every policy's)",
    )
    parser.add_argument(
        "--tick-phases",
        action="store_true",
        help="also split the tick by part at each scaling size (planners, each plan's transitions, idle "
        "expiry, garbage collection): `tick_phases` in the report",
    )
    parser.add_argument("--callers", type=int, default=500)
    parser.add_argument("--duration-seconds", type=float, default=10.0)
    parser.add_argument("--channels", type=int, default=4, help="gRPC channels over all caller processes")
    parser.add_argument(
        "--caller-processes",
        type=int,
        default=2,
        help="processes the callers run in (bench.scheduler_callers), so their CPU is not the scheduler's",
    )
    parser.add_argument(
        "--store",
        choices=("sqlite", "memory", "redis"),
        default="sqlite",
        help="the scheduler's durable state: SQLite file (the default), none, or Redis with leader election "
        "(a throwaway redis-server; Admit/Complete then answer only once their change is written)",
    )
    parser.add_argument(
        "--compare-tree",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="also run the rpc part against the scheduler of another checkout (e.g. main's HEAD from "
        "`git worktree add`), interleaved with this one's, with the same load generator",
    )
    parser.add_argument(
        "--admit-stream",
        action="store_true",
        help="callers admit with AdmitStream (the router's call) instead of the unary Admit",
    )
    parser.add_argument(
        "--mux",
        action="store_true",
        help="run each tree with AdmitStream and then with AdmitMux (one multiplexed stream per caller "
        "process), interleaved in every round; `rpc.summary` has the medians per path",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also run the rpc part against bench.grpc_floor (the same service answering empty messages): "
        "the CPU per round trip gRPC and protobuf alone cost, beside the scheduler's",
    )
    parser.add_argument("--rounds", type=int, default=1, help="rpc runs per tree, interleaved")
    parser.add_argument(
        "--attribute",
        action="store_true",
        help="sample the scheduler with py-spy during the rpc window and split its CPU by part of the path",
    )
    parser.add_argument("--py-spy", default=None, help="py-spy binary (default: on PATH, else /tmp/spyenv/bin)")
    parser.add_argument(
        "--memory-programs",
        type=int,
        default=10_000,
        help="programs loaded (one turn each) to report the scheduler's RSS per 10,000 programs (0 skips)",
    )
    parser.add_argument(
        "--soak-s", type=float, default=0.0, help="then Admit+Complete over those programs this long, sampling RSS"
    )
    parser.add_argument("--rpc-only", action="store_true", help="only the rpc part (and its memory figures)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.programs, args.replicas, args.ticks = 500, 8, 5
        args.callers, args.duration_seconds, args.channels = 20, 1.0, 2
        args.scaling_programs, args.scaling_ticks = "200,1000", 5
        args.memory_programs = min(args.memory_programs, 300)
        args.soak_s = 1.0
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    trees: list[tuple[str, Path | None]] = [("this", ROOT)]
    if args.floor:
        trees.append(("floor", None))
    for spec in args.compare_tree:
        name, _, path = spec.partition("=")
        if not path:
            parser.error(f"--compare-tree wants NAME=PATH, got {spec!r}")
        trees.append((name, Path(path).resolve()))
    rpc_kwargs = dict(
        caller_procs=args.caller_processes,
        trees=tuple(trees),
        rounds=args.rounds,
        store=args.store,
        memory_programs=args.memory_programs,
        soak_s=args.soak_s,
        attribute=args.attribute,
        py_spy_path=args.py_spy,
        profile_dir=Path(args.out).parent,
        stream=args.admit_stream,
        mux=args.mux,
    )
    if args.rpc_only:
        rpc = asyncio.run(bench_rpc(args.callers, args.duration_seconds, args.channels, **rpc_kwargs))
        router_state = bench_router_state(args.memory_programs) if args.memory_programs else None
        report = {"benchmark": "scheduler", "smoke": args.smoke, "rpc": rpc, "router_state": router_state}
        print(json.dumps(report, indent=2))
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        for row in rpc["summary"]:
            print(
                f"{row['tree']:>8} {row['path']:<12} x{row['rounds']}: {row['round_trips_per_s']} round trips/s, "
                f"p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms, "
                f"scheduler {row['scheduler_us_per_round_trip']} us/round trip ({row['scheduler_cores']} cores), "
                f"{row['errors']} errors"
            )
        return 0
    sizes = [int(n) for n in args.scaling_programs.split(",") if n.strip()]
    # The collector's settings the scheduler's main applies once it has started (services/common/process/heap.py),
    # applied here at the same point: before any table is built (a scheduler started on an empty store).
    settle_heap()
    policies = TICK_POLICIES if args.pause_policy == "both" else (args.pause_policy,)
    tick_runs = [
        {
            "pause_policy": policy,
            "tick": bench_tick(args.programs, args.replicas, args.ticks, pause_policy=policy),
            "tick_scaling": bench_tick_scaling(sizes, args.replicas, args.scaling_ticks, policy) if sizes else None,
            "tick_phases": (
                [bench_tick_phases_pure(n, args.replicas, args.scaling_ticks, policy) for n in sizes]
                if args.tick_phases
                else None
            ),
        }
        for policy in policies
    ]
    tick, scaling, phases = (tick_runs[0][k] for k in ("tick", "tick_scaling", "tick_phases"))
    if args.tick_only:
        report = {"benchmark": "scheduler", "smoke": args.smoke, "tick": tick, "tick_scaling": scaling}
        if phases is not None:
            report["tick_phases"] = phases
        report["tick_runs"] = tick_runs
        report["machine"] = machine()
        report["generated_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        print(json.dumps(report, indent=2))
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")  # the JSON report, as every mode writes
        print(f"wrote {args.out}")
        return 0
    rpc = asyncio.run(bench_rpc(args.callers, args.duration_seconds, args.channels, **rpc_kwargs))
    recovery = asyncio.run(bench_recovery(args.programs, args.replicas))
    report = {
        "router_state": bench_router_state(args.memory_programs) if args.memory_programs else None,
        "benchmark": "scheduler",
        "smoke": args.smoke,
        "tick": tick,
        "tick_scaling": scaling,
        "tick_phases": phases,
        "tick_runs": tick_runs,
        "rpc": rpc,
        "recovery": recovery,
        "machine": machine(),
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
