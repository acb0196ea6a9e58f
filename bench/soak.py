"""`make bench-soak` / `python -m bench.soak`: agent programs through the full stack for minutes, no leaks.

    python -m bench.soak --programs 256 --duration-s 600 --out bench/results/soak.json [--quick]
                         [--workers 4] [--speedup S] [--max-turns 6] [--warmup-fraction 0.2]

Starts the local cluster exactly as `bandmaster up` does (`services.launcher.cluster.start_cluster`:
simulated workers, capacity, scheduler, router), then keeps `--programs` SWE-agent programs in
flight through the router's OpenAI API for `--duration-s` wall seconds: every program is played by
the `clients/player.py` Runner with session headers and a final request, and a program that finishes is
replaced at once by a new one (fresh draws from the shipped trace, truncated to `--max-turns` so
that programs do finish and new ones start). The slots' first programs start spread over
`--ramp-s`. At the deadline no new program starts; the ones in flight get `--drain-s` to finish,
then whatever is still running is cancelled.

Every `--sample-s` seconds the resident set (`VmRSS` in `/proc/<pid>/status`) of every child
process is read. Memory is judged from the end of the warm-up: the latest of `--warmup-fraction` of
the duration, the ramp plus the routers' prefix-index TTL (read from the scheduler: the index has
turned over once), and the end of the last of the slots' first programs (the cohort that started
together, and paused together, is gone), at most half the run (`memory_warmup_end`). A service's
RSS at warm-up end and at the end is the median of its samples
in the `--window-s` seconds before each point (a single sample can catch a transient peak), and
its growth is end / warm-up - 1.

Targets, PASS/MISS in the report's `targets`:

* lost programs == 0. A program is lost when any of its turns failed (non-200, an error in the
  stream, a transport error or timeout, no tokens) or it was still running when the drain ended.
* every service's RSS growth after warm-up < 10%. Judged by full runs only: `--quick` reports it
  but a run of seconds is noise, so its exit status depends on lost programs alone.

The JSON report (`--out`) holds the counts, errors by kind, steps/min, per-service RSS and CPU
figures, the RSS timeline, the scheduler's counters after the drain, the warnings and errors in
the services' logs, the machine's CPU load and the simulated workers' lag behind their clock (a
starved machine shows there first). The services' logs are deleted after a passing run and kept
(their directory is printed) after a failing one. Exit status: 0 when every judged target passes, 1 otherwise,
2 on invalid flags.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Iterator, Sequence

import aiohttp

from bench.config_flags import add_config_flags, config_from_args
from bench.machine import machine as machine_block
from bench.peers import wait_routable
from bench.rss import rss_kb, slope_kb_per_min
from clients.player import (
    FINAL,
    SESSION,
    SYSTEM_PROMPT_TOKENS,
    ProgramRecord,
    Runner,
    RunResult,
    build_workload,
    text_of_n_tokens,
)
from clients.workloads import Program
from services.common.settings.config import require
from services.common.settings.errors import ConfigError

MODEL = "bandmaster-sim"
LOST_TARGET = 0
GROWTH_TARGET_PCT = 10.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class SoakConfig:
    """One soak run: the load, the cluster it runs on and how memory is sampled."""

    programs: int = 256
    """Programs in flight at once during the steady state (a finished one is replaced at once)."""
    duration_s: float = 600.0
    """Wall seconds of steady state; then no new program starts and the drain begins."""
    workers: int = 4
    worker_kv_tokens: int = 131_072
    speedup: float = 2.0
    """The simulated workers' --speedup, and the Runner's time scale. Chosen so that two shared
    cores keep up with 256 programs (docs/benchmarks/soak.md#sizing)."""
    ramp_s: float = 10.0
    """Wall seconds over which the slots start their first program. The router limits how fast one
    client opens programs (`--client-new-programs-burst` 200, then 50/s), and this process is one
    client: starting all 256 in the same instant would be refused with 429 by design."""
    max_turns: int = 6
    """Turns per program (the trace's first turns): short programs finish, so new ones keep starting."""
    token_scale: float = 1.0
    warmup_fraction: float = 0.2
    sample_s: float = 5.0
    """Seconds between RSS samples."""
    window_s: float = 30.0
    """RSS at a point = the median of the samples in the `window_s` seconds before it."""
    drain_s: float = 240.0
    """Wall seconds the programs in flight at the deadline get to finish before they are cancelled (lost)."""
    turn_timeout_s: float = 300.0
    """Wall seconds one turn may take, including a pause by the scheduler, before it fails."""
    seed: int = 0

    def __post_init__(self) -> None:
        require(self.programs >= 1, "programs", self.programs, "programs >= 1")
        require(self.duration_s > 0, "duration_s", self.duration_s, "duration_s > 0")
        require(1 <= self.workers <= 64, "workers", self.workers, "1 <= workers <= 64")
        require(self.worker_kv_tokens >= 16, "worker_kv_tokens", self.worker_kv_tokens, "worker_kv_tokens >= 16")
        require(self.speedup > 0, "speedup", self.speedup, "speedup > 0")
        require(
            0 <= self.ramp_s < self.warmup_s,
            "ramp_s",
            self.ramp_s,
            "0 <= ramp_s < duration_s * warmup_fraction (the ramp is part of the warm-up)",
        )
        require(self.max_turns >= 1, "max_turns", self.max_turns, "max_turns >= 1")
        require(self.token_scale > 0, "token_scale", self.token_scale, "token_scale > 0")
        require(0 < self.warmup_fraction < 1, "warmup_fraction", self.warmup_fraction, "0 < warmup_fraction < 1")
        require(self.sample_s > 0, "sample_s", self.sample_s, "sample_s > 0")
        require(self.window_s >= self.sample_s, "window_s", self.window_s, "window_s >= sample_s")
        require(
            self.window_s <= self.warmup_s,
            "window_s",
            self.window_s,
            "window_s <= duration_s * warmup_fraction (the warm-up window must lie inside the run)",
        )
        require(self.drain_s >= 0, "drain_s", self.drain_s, "drain_s >= 0")
        require(self.turn_timeout_s > 0, "turn_timeout_s", self.turn_timeout_s, "turn_timeout_s > 0")

    @property
    def warmup_s(self) -> float:
        return self.duration_s * self.warmup_fraction


FULL = SoakConfig()
QUICK = SoakConfig(
    programs=16,
    duration_s=30.0,
    workers=2,
    worker_kv_tokens=65_536,
    speedup=10.0,
    ramp_s=1.0,
    max_turns=4,
    sample_s=1.0,
    window_s=3.0,
    drain_s=15.0,
    turn_timeout_s=15.0,
)
"""For the test suite: about 40 s in all (some 160 programs through 16 slots), every field of the report."""


# ------------------------------------------------------------------------------- pure figures


def error_kind(message: str) -> str:
    """A short, bounded label for a failed turn's error text (`TurnRecord.error`)."""
    if message.startswith("HTTP "):
        return "http_" + message[5:].split(":", 1)[0].strip()
    if message.startswith("finish_reason="):
        return message
    if message == "no tokens":
        return "no_tokens"
    return message.split(":", 1)[0].strip() or "unknown"


def window_median(samples: Sequence[tuple[float, int]], end_s: float, window_s: float) -> int | None:
    """Median of the values sampled in (end_s - window_s, end_s]; None when there is none."""
    values = [v for t, v in samples if end_s - window_s < t <= end_s]
    return int(statistics.median(values)) if values else None


def growth_pct(before: int | None, after: int | None) -> float | None:
    if not before or after is None:
        return None
    return round((after - before) / before * 100.0, 2)


def memory_figures(
    timeline: Sequence[dict], services: Sequence[str], warmup_s: float, end_s: float, window_s: float
) -> dict[str, dict]:
    """Per service: RSS (kB) at warm-up end, at the end of the steady state and after the drain, the
    maximum, the growth from warm-up end to the end of the steady state (the target), and the slope
    over the steady state, which tells a steady climb (a leak, or a cache still filling) from a
    one-off step or a swing that happens to straddle one of the two windows."""
    out = {}
    for name in services:
        samples = [(row["t_s"], row["rss_kb"][name]) for row in timeline if row["rss_kb"].get(name) is not None]
        warm = window_median(samples, warmup_s, window_s)
        end = window_median(samples, end_s, window_s)
        out[name] = {
            "rss_warmup_kb": warm,
            "rss_end_kb": end,
            "rss_after_drain_kb": samples[-1][1] if samples else None,
            "rss_max_kb": max((v for _, v in samples), default=None),
            "growth_pct": growth_pct(warm, end),
            "steady_slope_kb_per_min": slope_kb_per_min(samples, warmup_s, end_s),
        }
    return out


def memory_warmup_end(config: "SoakConfig", cohort_end_s: float | None, index_ttl_s: float) -> tuple[float, str]:
    """When memory is measured from: the stack is in its steady state only once (a) the slots' first programs,
    which all started together and grow their contexts in step (the pause storm of a synchronised start),
    have all finished, and (b) the router's prefix index, whose entries live `index_ttl_s`, has turned over
    once since the ramp. At least `warmup_fraction` of the run, at most half of it (a run whose start-up takes
    longer is too short to judge growth; the report then says "capped"). Returns (seconds, reason)."""
    cap = config.duration_s / 2
    candidates = {"warmup_fraction": config.warmup_s, "index_ttl": config.ramp_s + index_ttl_s}
    candidates["first_programs"] = cohort_end_s if cohort_end_s is not None else float("inf")
    reason, end = max(candidates.items(), key=lambda kv: kv[1])
    if end > cap:
        return max(cap, config.window_s), "capped"
    return max(end, config.window_s), reason


def targets(lost: int, memory: dict[str, dict], *, judge_memory: bool) -> list[dict]:
    """The two targets, PASS/MISS. The memory one names its worst service: one without a growth figure
    (it died, or was never sampled) if there is one, since it cannot pass, else the largest growth."""
    growths = {name: m["growth_pct"] for name, m in memory.items()}
    missing = [name for name, growth in growths.items() if growth is None]
    worst = missing[0] if missing else max(growths, key=growths.__getitem__, default=None)
    memory_ok = worst is not None and not missing and growths[worst] < GROWTH_TARGET_PCT
    return [
        {
            "name": "lost programs",
            "value": lost,
            "needs": f"== {LOST_TARGET}",
            "status": "PASS" if lost == LOST_TARGET else "MISS",
            "judged": True,
        },
        {
            "name": "RSS growth after warm-up, worst service",
            "value": growths.get(worst) if worst else None,
            "service": worst,
            "needs": f"< {GROWTH_TARGET_PCT:g}%",
            "status": "PASS" if memory_ok else "MISS",
            "judged": judge_memory,
        },
    ]


# --------------------------------------------------------------------------------- /proc reads


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a live process (/proc/<pid>/stat fields 14 and 15)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


LOG_LEVELS = ("WARNING", "ERROR", "CRITICAL")


def log_problems(lines: Sequence[str], examples: int = 3) -> dict:
    """Warning and error lines of one service log (`<date> <time> <LEVEL> <logger> <message>`): counts
    per level and the first few distinct messages. A fail-open or a retry shows up here, not in the
    client's figures."""
    counts: Counter[str] = Counter()
    seen: list[str] = []
    for line in lines:
        parts = line.split(" ", 3)
        if len(parts) == 4 and parts[2] in LOG_LEVELS:
            counts[parts[2].lower()] += 1
            message = f"{parts[2]} {parts[3]}"[:240]
            if len(seen) < examples and message not in seen:
                seen.append(message)
    return {**counts, "examples": seen} if counts else {}


# ------------------------------------------------------------------------------------- the load


class SoakRunner(Runner):
    """The Runner, played in steady state: `slots` programs at once until a deadline."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.running = 0
        self.first_program_done_s: dict[int, float] = {}
        """Slot -> seconds from the start to the end of its first program (the synchronised cohort)."""
        self.other_errors: Counter[str] = Counter()
        """Errors outside a turn: failed final requests, and a slot that died of an exception."""

    async def soak(
        self, next_program: Callable[[], Program], slots: int, deadline: float, drain_s: float, ramp_s: float = 0.0
    ) -> dict:
        """Start a new program in every free slot until `deadline` (monotonic), the slots' first ones
        spread evenly over `ramp_s`; then wait up to `drain_s` for the ones in flight and cancel the
        rest. Returns the drain's figures."""
        result = self.result = RunResult(self.arm, slots, 0.0, self.time_scale)
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        start = time.monotonic()
        async with aiohttp.ClientSession(connector=connector, timeout=self.timeout) as session:
            system = text_of_n_tokens(SYSTEM_PROMPT_TOKENS, 0)

            async def slot(index: int) -> None:
                await asyncio.sleep(ramp_s * index / slots)
                while time.monotonic() < deadline:
                    program = next_program()
                    record = ProgramRecord(program.program_id, len(program.turns))
                    result.programs.append(record)
                    self.running += 1
                    try:
                        await self._play(session, program, system, record, result)
                    finally:
                        self.running -= 1
                    self.first_program_done_s.setdefault(index, round(time.monotonic() - start, 2))

            tasks = [asyncio.create_task(slot(i)) for i in range(slots)]
            await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()))
            drain_started = time.monotonic()
            running_at_deadline = self.running
            _, pending = await asyncio.wait(tasks, timeout=drain_s)
            for task in pending:
                task.cancel()
            for outcome in await asyncio.gather(*tasks, return_exceptions=True):
                if isinstance(outcome, Exception):  # a bug here, not in the stack: its program counts as lost
                    self.other_errors[f"slot_{type(outcome).__name__}"] += 1
            drain = {
                "running_at_deadline": running_at_deadline,
                "drain_s": round(time.monotonic() - drain_started, 2),
                "cancelled_at_drain": len(pending),
            }
        result.wall_s = time.monotonic() - start
        return drain

    async def _final(self, session, program_id: str) -> None:
        # As the Runner's, but a final that fails is counted: the scheduler then holds the program
        # until its idle TTL, which is exactly the kind of growth a soak is after.
        body = {"model": self.model, "messages": [{"role": "user", "content": "done"}], "max_tokens": 1}
        try:
            async with session.post(
                f"{self.endpoint}/chat/completions", json=body, headers={SESSION: program_id, FINAL: "true"}
            ) as response:
                await response.read()
                if response.status != 200:
                    self.other_errors[f"final_http_{response.status}"] += 1
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            self.other_errors[f"final_{type(exc).__name__}"] += 1


def program_stream(config: SoakConfig) -> Iterator[Program]:
    """Endless distinct programs: batches of `programs` draws, each batch with its own seed."""
    batch = 0
    while True:
        for program in build_workload(
            "swe",
            config.programs,
            seed=config.seed + batch,
            max_turns=config.max_turns,
            token_scale=config.token_scale,
            tool_time_scale=1.0,
        ):
            yield replace(program, program_id=f"{program.program_id}.{batch}")
        batch += 1


# ---------------------------------------------------------------------------------- the shell


class MemorySampler:
    """Every `interval_s`, the RSS of every child and the load's progress, as one timeline row."""

    def __init__(self, pids: dict[str, int], runner: SoakRunner, interval_s: float, start: float) -> None:
        self.pids = pids
        self.runner = runner
        self.interval_s = interval_s
        self.start = start
        self.timeline: list[dict] = []
        self.phase = "warmup"

    def sample(self) -> None:
        turns = self.runner.result.turns if self.runner.result else []
        self.timeline.append(
            {
                "t_s": round(time.monotonic() - self.start, 2),
                "phase": self.phase,
                "programs_running": self.runner.running,
                "turns_ok": sum(1 for t in turns if t.ok),
                "rss_kb": {name: rss_kb(pid) for name, pid in self.pids.items()},
            }
        )

    async def run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.interval_s)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_soak(config: SoakConfig, *, quick: bool = False) -> dict:
    from services.launcher.cluster import ClusterConfig, start_cluster
    from services.launcher.probes import busy_share, cpu_times, starved, wait_for_workers, worker_late_s

    state_dir = Path(tempfile.mkdtemp(prefix="bandmaster-soak-"))
    cluster = start_cluster(
        ClusterConfig(
            workers=config.workers,
            worker_kv_tokens=config.worker_kv_tokens,
            worker_speedup=config.speedup,
            model_name=MODEL,
            http_port=0,
            state_dir=state_dir,
            log_level="WARNING",
            extra_worker_args=("--log-level", "WARNING"),
        )
    )
    try:
        wait_for_workers(cluster.capacity.endpoint, config.workers)
        wait_routable(cluster.http_url, MODEL, lambda: not cluster.supervisor.failed())
        pids = {child.spec.name: child.process.pid for child in cluster.supervisor.children}
        _log(
            f"bench.soak: {config.programs} programs for {config.duration_s:g}s on {config.workers} simulated "
            f"workers at {config.speedup:g}x; sampling {', '.join(pids)} every {config.sample_s:g}s"
        )
        cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}

        async def play() -> tuple[SoakRunner, MemorySampler, dict, dict]:
            runner = SoakRunner(
                cluster.http_url + "/v1",
                MODEL,
                time_scale=config.speedup,
                request_timeout_s=config.turn_timeout_s,
                seed=config.seed,
                arm="soak",
            )
            programs = program_stream(config)
            late_before = await worker_late_s(cluster.workers)
            start = time.monotonic()
            sampler = MemorySampler(pids, runner, config.sample_s, start)
            sampling = asyncio.create_task(sampler.run())

            async def phases() -> None:
                await asyncio.sleep(config.warmup_s)
                sampler.phase = "steady"
                await asyncio.sleep(config.duration_s - config.warmup_s)
                sampler.phase = "drain"

            marking = asyncio.create_task(phases())
            progress = asyncio.create_task(_progress(sampler, config))
            drain = await runner.soak(
                lambda: next(programs), config.programs, start + config.duration_s, config.drain_s, config.ramp_s
            )
            for task in (marking, progress, sampling):
                task.cancel()
            await asyncio.gather(marking, progress, sampling, return_exceptions=True)
            sampler.phase = "after_drain"
            sampler.sample()
            late_after = await worker_late_s(cluster.workers)
            lags = [late_after[u] - late_before[u] for u in late_after if u in late_before]
            machine = {"late_fraction": round(max(lags) / runner.result.wall_s, 4) if lags else None}
            return runner, sampler, drain, machine

        cpu_machine, cpu_client = cpu_times(), time.process_time()
        runner, sampler, drain, machine = asyncio.run(play())
        cpu_busy = busy_share(cpu_machine, cpu_times())
        machine["cpu_busy"] = round(cpu_busy, 4) if cpu_busy is not None else None
        machine["bench_client_cpu_s"] = round(time.process_time() - cpu_client, 2)
        machine["starved"] = starved(machine)
        exited = [c.spec.name for c in cluster.supervisor.failed()]
        cpu = {name: _delta(cpu_before[name], cpu_seconds(pid)) for name, pid in pids.items()}
        scheduler = scheduler_stats(cluster.scheduler.endpoint)
        index_ttl_s = router_index_ttl(cluster.scheduler.endpoint)
        logs = {c.spec.name: c.log_path for c in cluster.supervisor.children}
    finally:
        cluster.stop()
    problems = {}
    for name, path in logs.items():
        found = log_problems(path.read_text(errors="replace").splitlines())
        if found:
            problems[name] = found
    report = build_report(
        config, runner, sampler, drain, machine, cpu, scheduler, exited, problems, quick=quick, index_ttl_s=index_ttl_s
    )
    if passed(report):
        shutil.rmtree(state_dir, ignore_errors=True)
    else:
        _log(f"bench.soak: the services' logs are kept in {state_dir}")
    return report


def scheduler_stats(address: str) -> dict:
    """The scheduler's counters after the drain. Its table should be empty again (programs_active,
    tickets_in_flight 0): every program sent its final request or was cancelled."""
    import grpc

    from bandmaster.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stats = scheduler_pb2_grpc.SchedulerStub(channel).GetStats(scheduler_pb2.GetStatsRequest(), timeout=5)
    return {f.name: getattr(stats, f.name) for f in stats.DESCRIPTOR.fields if not f.is_repeated}


def router_index_ttl(address: str) -> float:
    """The routers' prefix-index TTL in force (the scheduler hands it to every router)."""
    import grpc

    from bandmaster.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        config = scheduler_pb2_grpc.SchedulerStub(channel).GetRouterConfig(
            scheduler_pb2.GetRouterConfigRequest(), timeout=5
        )
    return float(config.router_ttl_secs)


def _delta(before: float | None, after: float | None) -> float | None:
    return round(after - before, 2) if before is not None and after is not None else None


async def _progress(sampler: MemorySampler, config: SoakConfig) -> None:
    every_s = max(config.sample_s, min(60.0, config.duration_s / 10))
    while True:
        await asyncio.sleep(every_s)
        row = sampler.timeline[-1] if sampler.timeline else None
        if row:
            rss = " ".join(f"{n}={(v or 0) / 1024:.0f}M" for n, v in row["rss_kb"].items())
            _log(
                f"bench.soak: t={row['t_s']:.0f}s {row['phase']} running={row['programs_running']} "
                f"turns_ok={row['turns_ok']} {rss}"
            )


def build_report(
    config: SoakConfig,
    runner: SoakRunner,
    sampler: MemorySampler,
    drain: dict,
    machine: dict,
    cpu: dict,
    scheduler: dict,
    exited: list[str],
    log_problems: dict,
    *,
    quick: bool,
    index_ttl_s: float = 120.0,
) -> dict:
    result = runner.result
    summary = result.summary()
    programs = result.programs
    failed = [p for p in programs if p.errors]
    unfinished = [p for p in programs if not p.errors and not p.finished]
    completed = [p for p in programs if p.finished]
    errors = Counter(error_kind(t.error) for t in result.turns if not t.ok)
    if unfinished:
        errors["unfinished_after_drain"] = len(unfinished)
    errors.update(runner.other_errors)
    first = runner.first_program_done_s
    cohort_end_s = max(first.values()) if len(first) >= config.programs else None
    warmup_end_s, warmup_reason = memory_warmup_end(config, cohort_end_s, index_ttl_s)
    memory = memory_figures(sampler.timeline, list(sampler.pids), warmup_end_s, config.duration_s, config.window_s)
    # The same growth from the fixed fraction, for comparison (not judged: see memory_warmup_end).
    from_fraction = memory_figures(
        sampler.timeline, list(sampler.pids), config.warmup_s, config.duration_s, config.window_s
    )
    for name, figures in memory.items():
        figures["cpu_s"] = cpu.get(name)
        figures["growth_pct_from_warmup_fraction"] = from_fraction[name]["growth_pct"]
    lost = len(failed) + len(unfinished)
    checks = targets(lost, memory, judge_memory=not quick)
    # Steady-state rate: the turns completed between warm-up end and the deadline, per modelled minute.
    steady = [r for r in sampler.timeline if config.warmup_s <= r["t_s"] <= config.duration_s]
    steady_steps = None
    if len(steady) >= 2 and steady[-1]["t_s"] > steady[0]["t_s"]:
        minutes = (steady[-1]["t_s"] - steady[0]["t_s"]) * config.speedup / 60.0
        steady_steps = round((steady[-1]["turns_ok"] - steady[0]["turns_ok"]) / minutes, 1)
    ok = [t for t in result.turns if t.ok]
    # How much of the machine this run itself used (the services and this load generator), as a share
    # of all cores over the run: the rest of `cpu_busy` was other work on the machine.
    ours = sum(v for v in cpu.values() if v is not None) + machine["bench_client_cpu_s"]
    machine["soak_cpu_share"] = round(ours / (result.wall_s * (os.cpu_count() or 1)), 4) if result.wall_s else None
    return {
        "benchmark": "soak",
        "quick": quick,
        "config": asdict(config),
        "programs": {
            "started": len(programs),
            "completed": len(completed),
            "lost": lost,
            "lost_turn_failed": len(failed),
            "lost_unfinished_after_drain": len(unfinished),
            **drain,
        },
        "turns": {"ok": summary["turns_ok"], "failed": summary["turns_failed"]},
        "steps_per_min": summary["steps_per_min"],
        "steady_steps_per_min": steady_steps,
        "programs_per_min": summary["programs_per_min"],
        "turns_per_wall_min": round(len(ok) / (result.wall_s / 60.0), 1) if result.wall_s else 0.0,
        "wall_s": summary["wall_s"],
        "ttft_p50_s": summary["ttft_p50_s"],
        "ttft_p90_s": summary["ttft_p90_s"],
        "ttft_max_s": round(max((t.ttft_s for t in ok), default=0.0), 3),
        "kv_hit_rate": summary["kv_hit_rate"],
        "errors_by_kind": dict(errors.most_common()),
        "scheduler": scheduler,
        "services_exited": exited,
        "service_log_problems": log_problems,
        "memory": {
            "warmup_end_s": warmup_end_s,
            "warmup_end_reason": warmup_reason,
            "first_programs_done_s": cohort_end_s,
            "router_index_ttl_s": index_ttl_s,
            "end_s": config.duration_s,
            "window_s": config.window_s,
            "services": memory,
        },
        "machine": machine_block(**machine),
        "targets": checks,
        "timeline": sampler.timeline,
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def passed(report: dict) -> bool:
    return not report["services_exited"] and all(t["status"] == "PASS" for t in report["targets"] if t["judged"])


def text_summary(report: dict) -> str:
    p, t = report["programs"], report["turns"]
    lines = [
        f"programs started {p['started']}, completed {p['completed']}, lost {p['lost']} "
        f"(turn failed {p['lost_turn_failed']}, unfinished after drain {p['lost_unfinished_after_drain']})",
        f"turns ok {t['ok']}, failed {t['failed']}; {report['steps_per_min']} steps/min "
        f"(steady {report['steady_steps_per_min']}), TTFT p50 {report['ttft_p50_s']} s, p90 {report['ttft_p90_s']} s",
        f"errors by kind: {report['errors_by_kind'] or 'none'}",
        "scheduler: {pauses_total} pauses, {resumes_total} resumes, {tickets_expired_total} turn leases expired, "
        "{programs_active} programs and {tickets_in_flight} turns still in its table after the drain".format(
            **report["scheduler"]
        ),
        "warnings and errors in the services' logs: "
        + (
            ", ".join(
                f"{name} {', '.join(f'{n} {k}' for k, n in found.items() if k != 'examples')}"
                for name, found in report["service_log_problems"].items()
            )
            or "none"
        ),
        f"machine: CPU busy {report['machine']['cpu_busy']} (this run {report['machine']['soak_cpu_share']}), "
        f"workers late {report['machine']['late_fraction']}" + (" (starved)" if report["machine"]["starved"] else ""),
        f"memory judged from t={report['memory']['warmup_end_s']:.0f}s ({report['memory']['warmup_end_reason']}; "
        f"first programs all done at {report['memory']['first_programs_done_s']}s, router index TTL "
        f"{report['memory']['router_index_ttl_s']:g}s)",
        f"{'service':14s} {'warm-up MB':>10s} {'end MB':>8s} {'max MB':>8s} {'growth':>8s} {'MB/min':>7s} "
        f"{'CPU s':>7s}",
    ]
    for name, m in report["memory"]["services"].items():

        def mb(kb):
            return f"{kb / 1024:.1f}" if kb is not None else "-"

        growth = f"{m['growth_pct']:+.1f}%" if m["growth_pct"] is not None else "-"
        slope = m["steady_slope_kb_per_min"]
        slope = f"{slope / 1024:+.2f}" if slope is not None else "-"
        lines.append(
            f"{name:14s} {mb(m['rss_warmup_kb']):>10s} {mb(m['rss_end_kb']):>8s} {mb(m['rss_max_kb']):>8s} "
            f"{growth:>8s} {slope:>7s} {m['cpu_s'] if m['cpu_s'] is not None else '-':>7}"
        )
    for target in report["targets"]:
        judged = "" if target["judged"] else " (not judged: --quick)"
        lines.append(f"{target['status']} {target['name']}: {target['value']} (needs {target['needs']}){judged}")
    if report["services_exited"]:
        lines.append(f"MISS services exited during the run: {', '.join(report['services_exited'])}")
    return "\n".join(lines)


FLAGS = (
    ("programs", int),
    ("duration_s", float),
    ("workers", int),
    ("worker_kv_tokens", int),
    ("speedup", float),
    ("max_turns", int),
    ("token_scale", float),
    ("warmup_fraction", float),
    ("ramp_s", float),
    ("sample_s", float),
    ("window_s", float),
    ("drain_s", float),
    ("turn_timeout_s", float),
    ("seed", int),
)
"""SoakConfig fields with a flag (`--duration-s` for `duration_s`); an unset flag keeps FULL's or QUICK's value."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/soak.json"))
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"small and short, for the test suite ({QUICK.programs} programs, {QUICK.duration_s:g}s)",
    )
    add_config_flags(parser, FLAGS, FULL, QUICK)
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args, FLAGS, FULL, QUICK)
    except ConfigError as exc:
        _log(f"bench.soak: {exc}")
        return 2
    report = run_soak(config, quick=args.quick)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(text_summary(report))
    print(f"wrote {args.out}")
    return 0 if passed(report) else 1


if __name__ == "__main__":
    sys.exit(main())
