"""`python -m bench.compare`: every routing arm on the same workers, swept over parallel programs.

    python -m bench.compare --mode sim|live|both --workload swe|short|both \\
        --out-dir bench/results/agentic [--smoke] [--arms kv,oracle,bandmaster,...] \\
        [--pause-policy threshold,cost_aware] [--jobs N] [--live-repeats N] [--trace FILE] \\
        [--split tune|heldout|all]

The ThunderAgent evaluation (steps/min and KV hit rate against the number of parallel programs) for
two workloads: long-context coding agents (the shipped SWE-agent trace) and short-context tool
agents (`short_context_agents`). Arms, each on a fresh copy of the same simworker settings:

* `round_robin`        - sim: the simulator's round-robin arm; live: `sglang-router --policy round_robin`.
* `kv`                 - our router with the scheduler disabled (KV-aware routing only).
* `oracle`             - sim only: the kv arm with effectively unlimited GPU KV (nothing is ever
                         evicted); every arm's steps/min is also reported as a ratio to it.
* `sglang_cache_aware` - `sglang-router --policy cache_aware` (live only: the simulator has no model of it).
* `bandmaster-<policy>` - capacity + scheduler + router, one arm per selected pause policy.
* `thunderagent`, `continuum` - the peer systems written from their papers (harness/peers): sim: the
                         policy core in the simulator; live: `python -m bench.peer_proxy` in front of
                         the simworkers, the same core at the workers' speedup.

A scenario spec per workload fixes the workers, the KV per worker, the turns per program, the token
scale and the parallel-program counts. "Memory that fits" = the workers' KV pool / the mean peak
context of the workload's programs; every point records its oversubscription factor
(parallel / fits). Sim mode runs every arm at every point through `harness.simlib.simulate`; live mode
starts each arm's processes per point, plays the programs with the `clients/player.py` Runner at
`--time-scale` = the workers' speedup, reads the workers' counters and stops the stack, `--live-repeats`
times per arm and point (3; the arms interleaved round by round), and reports the median run. The sim
sweep is the large one; the live sweep is a few points with fewer turns so that it finishes in about
10 minutes. Results go to `<out-dir>/results.json` (rewritten after every run, so a partial sweep
is kept), then `bench/report.py` writes the PNGs and `summary.md` and the targets are printed.

Live mode also simulates every live point (the `live-sim` sweeps: the same programs, the live
control law and router clocks at the live speedup, `harness.simlib.live_control_params`), so that the
report can check that the live ratio Bandmaster / kv reproduces the simulator's within 10%. The oracle
is simulated there too: the live summary gives each arm's live steps/min as a share of it, the bound
at exactly the point measured (what a target such as "1.5x sglang-router" asks of the policy there).
SWE programs come from the tuning part of the shipped trace unless `--trace` / `--split` say
otherwise (clients/workloads/draws.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Sequence

from bench.machine import machine
from bench.peers import launch_peer_proxy, launch_sglang_router, peer_stats, wait_routable
from clients.player import Runner, build_workload, scrape_counters
from clients.workloads import DEFAULT_SPLIT, SPLITS
from services.common.process.child_stop import stop_child
from services.common.settings.config import require
from services.common.settings.errors import ConfigError
from services.scheduler.core.policies import PAUSE_POLICIES

MODES = ("sim", "live")
LIVE_SIM = "live-sim"
SMOKE_TWIN_DRAWS = 2
"""The mode of a sweep that simulates a live sweep's points (the live-ratio check)."""
WORKLOADS = ("swe", "short")
ORACLE = "oracle"
PEER_ARMS = ("thunderagent", "continuum")
BASE_ARMS = ("round_robin", "kv", "sglang_cache_aware", *PEER_ARMS, ORACLE)
BANDMASTER = "bandmaster"
LIVE_ONLY_ARMS = frozenset({"sglang_cache_aware"})
SIM_ONLY_ARMS = frozenset({ORACLE})
MODEL = "bandmaster-sim"
RESULTS_FILE = "results.json"
# A live run stands for its arm only while the simulated workers kept their modelled clock: the worst
# worker's accumulated lateness (wall seconds its steps ended after their modelled end) as a share of
# the run's wall time. Past this share the machine, not the arm, set the pace, and the run is refused
# (recorded as an error, never taken as the median).
LATE_FRACTION_LIMIT = 0.02
# Keys of a run's summary that the report and the JSON keep (RunResult.summary() plus the sim's
# worker totals); the rest (sim cost, wall time) is per-run noise.
SUMMARY_KEYS = (
    "arm",
    "parallel_programs",
    "programs_done",
    "programs_total",
    "turns_ok",
    "turns_failed",
    "wall_s",
    "simulated_minutes",
    "steps_per_min",
    "programs_per_min",
    "program_time_p50_s",
    "program_time_p90_s",
    "ttft_p50_s",
    "ttft_p90_s",
    "kv_hit_rate",
    "worker_recomputed_tokens",
    "worker_retractions",
    "worker_host_loadback_tokens",
    "worker_prompt_tokens",
    "worker_cached_tokens",
    "worker_evicted_tokens",
    "steady_steps_per_min",
    "steady_window_s",
    "oracle_worker_kv_tokens",
    "sim_cpu_s",
)


# ------------------------------------------------------------------------------------ scenarios


@dataclass(frozen=True)
class SweepSpec:
    """One workload's sweep: the workers every arm runs on and the parallel-program counts."""

    workload: str
    workers: int
    worker_kv_tokens: int
    max_turns: int | None
    """Turns per program: programs are truncated to this many; None = full length (the SWE trace's
    programs run 43 turns on average and their contexts grow to ~40K tokens; the short generator
    makes 8)."""
    token_scale: float
    parallel: tuple[int, ...]
    """Parallel-program counts, from below saturation to about 4x the memory that fits."""
    programs_per_slot: int = 1
    """Programs in total per parallel slot (1: every program starts at once, as the published scenario)."""
    seed: int = 0
    speedup: float = 4.0
    """Live only: the simworkers' --speedup, and the Runner's --time-scale."""
    trace: str | None = None
    """SWE programs from this JSONL trace (shared/traces/swe_agent_trace.jsonl's format); None = shipped."""
    split: str = DEFAULT_SPLIT
    """The part of the trace the SWE programs come from (clients/workloads/draws.py)."""
    cache_report: bool = True
    """Live only: the simworkers run with `--enable-cache-report` (as docs/getting-started.md runs
    SGLang). Off: their completions carry no cached-token counts, the degraded set-up the scheduler
    must survive (`--no-cache-report`)."""
    late_limit: float = LATE_FRACTION_LIMIT
    """Live only: a run whose worst worker fell behind its clock by more than this share of the run's
    wall time is refused (`late_refusal`)."""
    twin_draws: int = 5
    """Live: the live-sim twin of each arm and point is the median (by steps/min) of this many simulated
    runs, each with another draw of the live path's per-turn costs and the router's tie-breaks on the same
    programs (`SimScenario.variant` 1..N): one simulated run is one draw of a few control decisions that
    small timing differences move, as one live run is."""
    breakdown: bool = False
    """Live: every run writes its services' spans to files and its row carries the per-turn wall-time
    breakdown (bench/breakdown.py); its live-sim twin the simulator's breakdown of the same point.
    Off by default: exporting spans costs the Bandmaster arms' processes CPU that the peers' proxies
    do not spend, so the headline runs leave it off (`--breakdown`)."""

    def __post_init__(self) -> None:
        require(self.workload in WORKLOADS, "workload", self.workload, f"workload in {{{', '.join(WORKLOADS)}}}")
        require(self.workers >= 1, "workers", self.workers, "workers >= 1")
        require(self.worker_kv_tokens >= 16, "worker_kv_tokens", self.worker_kv_tokens, "worker_kv_tokens >= 16")
        require(self.max_turns is None or self.max_turns >= 1, "max_turns", self.max_turns, "max_turns is None or >= 1")
        require(self.token_scale > 0, "token_scale", self.token_scale, "token_scale > 0")
        require(
            len(self.parallel) >= 1 and all(p >= 1 for p in self.parallel),
            "parallel",
            self.parallel,
            "at least one point, every point >= 1",
        )
        require(
            list(self.parallel) == sorted(set(self.parallel)), "parallel", self.parallel, "points strictly increasing"
        )
        require(self.programs_per_slot >= 1, "programs_per_slot", self.programs_per_slot, "programs_per_slot >= 1")
        require(self.speedup > 0, "speedup", self.speedup, "speedup > 0")
        require(self.split in SPLITS, "split", self.split, f"split in {{{', '.join(SPLITS)}}}")
        require(0 < self.late_limit < 1, "late_limit", self.late_limit, "0 < late_limit < 1")
        require(1 <= self.twin_draws <= 50, "twin_draws", self.twin_draws, "1 <= twin_draws <= 50")

    def programs(self, parallel: int) -> list:
        """The point's programs, exactly as the live runner and the simulator build them."""
        return build_workload(
            self.workload,
            parallel * self.programs_per_slot,
            seed=self.seed,
            max_turns=self.max_turns,
            token_scale=self.token_scale,
            tool_time_scale=1.0,
            trace=self.trace,
            split=self.split,
        )

    @property
    def pool_tokens(self) -> int:
        return self.workers * self.worker_kv_tokens

    def mean_context_tokens(self) -> float:
        """Mean peak context (last prompt + its output) over the programs of the largest point: what one
        program needs resident to run its last turn without recompute."""
        return statistics.fmean(p.peak_context_tokens for p in self.programs(self.parallel[-1]))

    def fits_programs(self) -> float:
        """Programs whose mean peak context fits in the workers' KV pool at once (saturation)."""
        return self.pool_tokens / self.mean_context_tokens()

    def describe(self) -> dict:
        fits = self.fits_programs()
        return {
            **asdict(self),
            "parallel": list(self.parallel),
            "pool_tokens": self.pool_tokens,
            "mean_context_tokens": round(self.mean_context_tokens(), 1),
            "fits_programs": round(fits, 2),
            "oversubscription": [round(p / fits, 2) for p in self.parallel],
        }


# The large sweep (simulator). SWE: full-length trace programs at their real sizes (prompts of ~20K
# tokens growing to a median peak of ~40K; mean peak ~44K over the 24 programs of the largest point)
# on 2 x 128K tokens, so about 6 programs fit; points at ~0.5, 1, 2, 3 and 4x. Truncating programs
# (the earlier 20 turns) kept contexts near 20K and the reachable KV hit rate near 94%. Short: the
# published scenario, 2 workers x 16K tokens, 8 turns, with 32 parallel programs as one point
# (~3x); about 10 programs fit.
SIM_SPECS = {
    "swe": SweepSpec(
        "swe", workers=2, worker_kv_tokens=131_072, max_turns=None, token_scale=1.0, parallel=(3, 6, 12, 18, 24)
    ),
    "short": SweepSpec(
        "short", workers=2, worker_kv_tokens=16_384, max_turns=8, token_scale=1.0, parallel=(5, 10, 20, 32, 40)
    ),
}
# The live sweep. SWE: the programs at their real token counts (a token scale below 1 relieves the
# memory pressure the sweep is there to test: at 0.25 every arm was within 10% of the others), their
# first 32 turns (~470K prompt tokens per program) on 2 workers of 64K KV tokens, where about 4.6
# programs fit: 14 and 18 programs are the 3x and 4x points. Speedup 4 keeps the simworkers on their
# clock on a 2-core machine (each run reports the workers' lateness and is refused past
# LATE_FRACTION_LIMIT). Short: the published scenario at two points (below saturation, ~4x).
LIVE_SPECS = {
    "swe": SweepSpec(
        "swe", workers=2, worker_kv_tokens=65_536, max_turns=32, token_scale=1.0, parallel=(14, 18), speedup=4.0
    ),
    "short": SweepSpec(
        "short", workers=2, worker_kv_tokens=16_384, max_turns=4, token_scale=1.0, parallel=(6, 40), speedup=4.0
    ),
}
# `--smoke`: tiny programs, two sim points, one live point (the `make test` version).
SMOKE_SIM_SPECS = {
    "swe": SweepSpec("swe", workers=2, worker_kv_tokens=1_024, max_turns=3, token_scale=0.05, parallel=(2, 12)),
    "short": SweepSpec("short", workers=2, worker_kv_tokens=1_024, max_turns=3, token_scale=0.2, parallel=(2, 8)),
}
# The smoke run checks shapes, at speedup 20 on a machine the rest of the suite keeps busy: its lateness
# is recorded and judged against a limit that only a stalled worker exceeds.
SMOKE_LATE_LIMIT = 0.5
SMOKE_LIVE_SPECS = {
    "swe": SweepSpec(
        "swe",
        workers=2,
        worker_kv_tokens=4_096,
        max_turns=2,
        token_scale=0.05,
        parallel=(3,),
        speedup=20.0,
        late_limit=SMOKE_LATE_LIMIT,
    ),
    "short": SweepSpec(
        "short",
        workers=2,
        worker_kv_tokens=4_096,
        max_turns=2,
        token_scale=0.2,
        parallel=(3,),
        speedup=20.0,
        late_limit=SMOKE_LATE_LIMIT,
    ),
}


# Live runs per arm and point. A live run of the short sweep lasts about 10 s, and on a quiet 2-core
# machine its steps/min moves by a few percent from run to run: four back-to-back runs of kv and
# bandmaster-cost_aware at 40 programs gave ratios 1.007, 1.018, 1.003 and 0.980, where one earlier
# single run had given 0.942. So each point is run this many times, round by round, and the median
# run stands for the arm (`median_run`).
LIVE_REPEATS = 3


def specs_for(mode: str, smoke: bool) -> dict[str, SweepSpec]:
    if mode == "sim":
        return SMOKE_SIM_SPECS if smoke else SIM_SPECS
    return SMOKE_LIVE_SPECS if smoke else LIVE_SPECS


def arms_for(mode: str, selected: Sequence[str], policies: Sequence[str]) -> list[str]:
    """Arm names in plotting order; `bandmaster` expands to one arm per pause policy. Live-only arms
    are left out of sim sweeps, sim-only ones (the oracle) out of live sweeps."""
    skip = SIM_ONLY_ARMS if mode == "live" else LIVE_ONLY_ARMS
    out = []
    for arm in selected:
        if arm == BANDMASTER:
            out += [f"{BANDMASTER}-{p}" for p in policies]
        elif arm not in skip:
            out.append(arm)
    return out


def policy_of(arm: str) -> str | None:
    return arm.split("-", 1)[1] if arm.startswith(BANDMASTER + "-") else None


# ------------------------------------------------------------------------------------ sim mode


# A re-prefill is "full" when the turn found at most this share of its previous context cached.
FULL_REPREFILL_CACHED_SHARE = 0.10


class _MeteredEngine:
    """Delegates to a simulated engine and adds up its step durations (the engine's busy time)."""

    def __init__(self, engine) -> None:
        self._engine = engine
        self.busy_s = 0.0

    def step(self, now: float):
        result = self._engine.step(now)
        self.busy_s += result.duration_s
        return result

    def commit_decode(self, steps: int):
        result = self._engine.commit_decode(steps)  # duration_s = the committed steps' span
        self.busy_s += result.duration_s
        return result

    def __getattr__(self, name: str):
        return getattr(self._engine, name)


def _prefill_s(profile, tokens: int, prefix_tokens: int, chunk_tokens: int) -> float:
    """The engine's prefill cost of `tokens` on top of `prefix_tokens`, chunk by chunk (batch terms left out)."""
    ms = 0.0
    while tokens > 0:
        t = min(tokens, chunk_tokens)
        ms += profile.prefill_chunk_ms(t, prefix_tokens)
        prefix_tokens += t
        tokens -= t
    return ms / 1000.0


def run_breakdown(
    programs: Sequence,
    turns: Sequence,
    control_events: Sequence,
    profile,
    chunk_tokens: int,
    busy_s: float,
    makespan_s: float,
    workers: int,
) -> dict:
    """Where a simulated run's uncached prompt tokens and engine time went.

    A turn's prompt is [turn k-1's prompt | turn k-1's answer | the new observation], and its
    uncached tokens (prompt - cached) are a suffix of it. They are split, from the end, into
    `new_observation`, `previous_answer` (the simworker's chat template re-renders the answer, so
    the engine's generated pages never match it: uncached in every arm) and re-prefill: context of
    turn k-1's prompt that the engine had and computes again, `after_pause` when the program was
    paused between the end of turn k-1 and turn k's first token, else `other` (evicted while in its
    tool, retracted, or routed elsewhere). A program's first turn is `first_turn`.
    `hit_rate_ceiling` = 1 - (everything but re-prefill) / prompt: the hit rate with no re-prefill.
    Turn times are rebuilt from the records (every program starts at 0: programs_per_slot = 1).
    Prefill seconds are the engine profile's cost of each part, so `recompute_share_of_busy` =
    re-prefill seconds / the engines' summed step time.

    The tail: steps/min counts every turn over the makespan, so one long program that runs on alone
    sets it. `steps_per_min_first_90pct` is the rate up to the moment 90% of the turns had finished,
    and `longest_program` names the program that ended last, with its pauses and the seconds it
    spent paused (pause to the next resume).
    """
    tool_after = {p.program_id: [t.tool_seconds_after for t in p.turns] for p in programs}
    pauses: dict[str, list[float]] = {}
    paused_s: dict[str, float] = {}
    since: dict[str, float] = {}
    for t_s, kind, _worker, program, _tokens in control_events:
        if kind == "pause":
            pauses.setdefault(program, []).append(t_s)
            since[program] = t_s
        elif kind in ("resume", "forced_resume") and program in since:
            paused_s[program] = paused_s.get(program, 0.0) + t_s - since.pop(program)
    ends: list[float] = []
    last_end: dict[str, float] = {}
    by_program: dict[str, list] = {}
    for turn in turns:
        if turn.ok:
            by_program.setdefault(turn.program_id, []).append(turn)
    tokens = {
        "first_turn": 0,
        "new_observation": 0,
        "previous_answer": 0,
        "reprefill_after_pause": 0,
        "reprefill_other": 0,
    }
    seconds = {"first_turn": 0.0, "new_tokens": 0.0, "reprefill": 0.0}
    full = {"after_pause": 0, "other": 0}
    prompt = cached = 0
    for program_id, rows in by_program.items():
        rows.sort(key=lambda r: r.turn)
        sent = end = 0.0
        previous = None
        for row in rows:
            if previous is not None:
                sent = end + tool_after[program_id][previous.turn]
            first_token = sent + row.ttft_s
            uncached = row.prompt_tokens - row.cached_tokens
            prompt += row.prompt_tokens
            cached += row.cached_tokens
            if previous is None or row.turn != previous.turn + 1:
                tokens["first_turn"] += uncached
                seconds["first_turn"] += _prefill_s(profile, uncached, row.cached_tokens, chunk_tokens)
            else:
                context = previous.prompt_tokens + previous.completion_tokens
                observation = min(uncached, max(0, row.prompt_tokens - context))
                answer = min(uncached - observation, max(0, row.prompt_tokens - previous.prompt_tokens - observation))
                again = uncached - observation - answer
                paused = any(end < t <= first_token for t in pauses.get(program_id, ()))
                tokens["new_observation"] += observation
                tokens["previous_answer"] += answer
                tokens["reprefill_after_pause" if paused else "reprefill_other"] += again
                if again and row.cached_tokens <= FULL_REPREFILL_CACHED_SHARE * previous.prompt_tokens:
                    full["after_pause" if paused else "other"] += 1
                seconds["reprefill"] += _prefill_s(profile, again, row.cached_tokens, chunk_tokens)
                seconds["new_tokens"] += _prefill_s(
                    profile, observation + answer, row.cached_tokens + again, chunk_tokens
                )
            end = sent + row.turn_s
            ends.append(end)
            previous = row
        last_end[program_id] = end
    capacity_s = makespan_s * workers
    ends.sort()
    n90 = math.ceil(0.9 * len(ends))
    longest = max(last_end, key=last_end.get) if last_end else ""
    uncached_total = sum(tokens.values())
    reprefill = tokens["reprefill_after_pause"] + tokens["reprefill_other"]
    return {
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_rate": round(cached / prompt, 4) if prompt else 0.0,
        "hit_rate_ceiling": round(1 - (uncached_total - reprefill) / prompt, 4) if prompt else 0.0,
        "uncached_tokens": tokens,
        "full_reprefills": full,
        "engine_busy_s": round(busy_s, 2),
        "engine_capacity_s": round(capacity_s, 2),
        "busy_share": round(busy_s / capacity_s, 4) if capacity_s else 0.0,
        "prefill_s": {k: round(v, 2) for k, v in seconds.items()},
        "recompute_share_of_busy": round(seconds["reprefill"] / busy_s, 4) if busy_s else 0.0,
        "steps_per_min_first_90pct": round(n90 / (ends[n90 - 1] / 60), 3) if ends and ends[n90 - 1] > 0 else 0.0,
        "longest_program": {
            "program_id": longest,
            "turns": len(by_program.get(longest, ())),
            "end_s": round(last_end.get(longest, 0.0), 1),
            "pauses": len(pauses.get(longest, ())),
            "paused_s": round(paused_s.get(longest, 0.0), 1),
        },
    }


def _engine_queue(timeline: dict) -> dict:
    """Mean requests queued and running per worker over the run's samples (the engines' own queues)."""
    cols = {c: i for i, c in enumerate(timeline["columns"])}
    rows = [r for samples in timeline["workers"].values() for r in samples]
    if not rows:
        return {"queued_mean": 0.0, "running_mean": 0.0}
    return {
        "queued_mean": round(statistics.fmean(r[cols["engine_queued"]] for r in rows), 2),
        "running_mean": round(statistics.fmean(r[cols["engine_running"]] for r in rows), 2),
    }


def sim_run(spec: SweepSpec, arm: str, parallel: int, *, as_live: bool = False, variant: int = 0) -> dict:
    """One arm at one point in the simulator: the summary, the scheduler counters, where the
    uncached tokens and engine time went, and (Bandmaster arms) the utilisation timeline.

    `as_live`: model the live run of this point instead (the live-ratio check): the control law
    and router clocks of `bandmaster up --speedup <spec.speedup>` and the live router's text
    prompts; summary and counters only."""
    from harness.simlib import SimScenario, Simulator, live_control_params
    from harness.simlib.live_path import LivePathCosts

    policy = policy_of(arm)
    live = dict(
        control=live_control_params(spec.speedup, policy or "threshold"),
        live_speedup=spec.speedup,
        router_prompt="text",
        # The live stack's per-turn costs outside the engine, measured (harness/simlib/live_path.py).
        live_path=LivePathCosts(),
    )
    scenario = SimScenario(
        arm=BANDMASTER if policy else arm,
        workload=spec.workload,
        programs=parallel * spec.programs_per_slot,
        parallel=parallel,
        max_turns=spec.max_turns,
        token_scale=spec.token_scale,
        seed=spec.seed,
        variant=variant,
        trace=spec.trace,
        split=spec.split,
        workers=spec.workers,
        worker_kv_tokens=spec.worker_kv_tokens,
        pause_policy=policy or "threshold",
        # Exact token pages: ~30% cheaper than the live router's text chunks, same cost formula
        # and the same relative figures (docs/simulator.md, "Prompts").
        **(live if as_live else dict(router_prompt="tokens")),
    )
    simulator = Simulator(scenario)
    meters = []
    for worker in simulator.workers:
        worker.engine = _MeteredEngine(worker.engine)
        meters.append(worker.engine)
    result = simulator.run()
    summary = result.summary()
    row = {
        "summary": {k: summary.get(k) for k in SUMMARY_KEYS if k in summary},
        "scheduler": result.scheduler_counters,
        "completed": result.completed,
    }
    if not result.completed:
        row["error"] = "the simulation hit its horizon with programs still running"
    if as_live:
        if spec.breakdown:
            from bench.breakdown import breakdown_from_sim

            row["turn_phases"] = breakdown_from_sim(result)
        return row
    if spec.programs_per_slot == 1:
        row["breakdown"] = {
            **run_breakdown(
                simulator.programs,
                result.run.turns,
                result.timeline["control_events"],
                simulator.workers[0].profile,
                scenario.worker_chunked_prefill_size,
                sum(m.busy_s for m in meters),
                result.run.wall_s,
                spec.workers,
            ),
            "engine_queue": _engine_queue(result.timeline),
        }
    if policy:
        row["timeline"] = result.timeline
    return row


# ----------------------------------------------------------------------------------- live mode


@dataclass
class LiveStack:
    """One arm's processes: workers and a front door; `stop` leaves nothing running."""

    url: str
    workers: list[str]
    session_headers: bool
    stop: Callable[[], None]
    counters: Callable[[], dict] = field(default=lambda: {})


def start_live_stack(spec: SweepSpec, arm: str, state_dir: Path) -> LiveStack:
    from services.launcher.cluster import ClusterConfig, start_cluster
    from services.launcher.probes import scheduler_counts, wait_for_workers

    policy = policy_of(arm)
    config = ClusterConfig(
        workers=spec.workers,
        worker_kv_tokens=spec.worker_kv_tokens,
        worker_speedup=spec.speedup,
        worker_cache_report=spec.cache_report,
        model_name=MODEL,
        http_port=0,
        scheduler=policy is not None,
        scheduler_args=("--pause-policy", policy) if policy else (),
        state_dir=state_dir,
        log_level="WARNING",
        # Seeded tie-breaks: the kv and Bandmaster arms route alike from run to run.
        router_args=("--seed", str(spec.seed)),
        extra_worker_args=("--log-level", "WARNING"),
    )
    if arm in ("kv",) or policy:
        cluster = start_cluster(config)
        try:
            wait_for_workers(cluster.capacity.endpoint, spec.workers)
            wait_routable(cluster.http_url, MODEL, lambda: not cluster.supervisor.failed())
        except BaseException:
            cluster.stop()
            raise
        return LiveStack(
            cluster.http_url,
            cluster.workers,
            True,
            cluster.stop,
            (lambda: scheduler_counts(cluster)) if policy else (lambda: {}),
        )

    if arm in PEER_ARMS:
        # The peer's proxy (bench.peer_proxy) in front of simworkers started as `bandmaster up` starts them.
        return _front_door_stack(
            config,
            spec.workers,
            state_dir,
            lambda urls: launch_peer_proxy(urls, arm, spec.speedup, state_dir / "peer-proxy.log"),
            session_headers=True,
            counters=peer_stats,
        )
    # sglang-router in front of simworkers started exactly as `bandmaster up` starts them. It knows no
    # programs: plain requests, no session headers and no final request.
    sglang_policy = {"round_robin": "round_robin", "sglang_cache_aware": "cache_aware"}[arm]
    return _front_door_stack(
        config,
        spec.workers,
        state_dir,
        lambda urls: launch_sglang_router(urls, sglang_policy, state_dir / "sglang-router.log"),
        session_headers=False,
    )


def _front_door_stack(
    config,
    workers: int,
    state_dir: Path,
    launch: Callable[[list[str]], tuple[subprocess.Popen, str]],
    *,
    session_headers: bool,
    counters: Callable[[str], dict] | None = None,
) -> LiveStack:
    """Simulated workers as `bandmaster up` starts them, behind a peer's front door process (`launch`
    takes the worker URLs and returns the process and its base URL); `stop` leaves nothing running."""
    from services.launcher.cluster import simworker_spec
    from services.launcher.supervisor import Supervisor

    supervisor = Supervisor(state_dir)
    door: subprocess.Popen | None = None
    try:
        urls = [c.endpoint for c in supervisor.start_all([simworker_spec(config, i) for i in range(workers)])]
        door, url = launch(urls)
        wait_routable(url, MODEL, lambda: door.poll() is None)
    except BaseException:
        _stop_process(door)
        supervisor.stop_all()
        raise

    def stop() -> None:
        _stop_process(door)
        supervisor.stop_all()

    return LiveStack(url, urls, session_headers, stop, (lambda: counters(url)) if counters else (lambda: {}))


def _stop_process(process: subprocess.Popen | None) -> None:
    stop_child(process, 10.0, name="front door")


def live_run(spec: SweepSpec, arm: str, parallel: int, state_dir: Path) -> dict:
    """Start the arm's stack, play the point's programs closed loop, read the counters and the
    workers' lateness, stop. A run whose workers fell behind their clock is refused (`late_refusal`).
    With `spec.breakdown` the row also carries where each turn's wall time went (bench/breakdown.py)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    if spec.breakdown:
        from bench.breakdown import LiveSpans

        with LiveSpans(state_dir / "spans") as spans:
            row = _live_run(spec, arm, parallel, state_dir)
        if "summary" in row:
            row["turn_phases"] = spans.report(spec.speedup)
        return row
    return _live_run(spec, arm, parallel, state_dir)


def _live_run(spec: SweepSpec, arm: str, parallel: int, state_dir: Path) -> dict:
    from services.launcher.probes import worker_late_s

    stack = start_live_stack(spec, arm, state_dir)
    try:
        programs = spec.programs(parallel)

        async def play() -> dict:
            runner = Runner(
                stack.url + "/v1",
                MODEL,
                session_headers=stack.session_headers,
                time_scale=spec.speedup,
                seed=spec.seed,
                arm=arm,
            )
            before = await scrape_counters(stack.workers)
            late_before = await worker_late_s(stack.workers)
            started = time.monotonic()
            result = await runner.run(programs, parallel)
            elapsed = time.monotonic() - started
            late_after = await worker_late_s(stack.workers)
            after = await scrape_counters(stack.workers)
            result.worker_counters = {k: after[k] - before[k] for k in after}
            return {**result.summary(), **lateness(late_before, late_after, elapsed)}

        summary = asyncio.run(play())
        scheduler = stack.counters()
    finally:
        stack.stop()
    row = {
        "summary": {k: summary.get(k) for k in SUMMARY_KEYS if k in summary},
        "scheduler": scheduler,
        "lateness": {k: summary[k] for k in LATENESS_KEYS},
    }
    refused = late_refusal(summary, spec.late_limit)
    if summary["turns_failed"]:
        row["error"] = f"{summary['turns_failed']} turns failed"
    elif refused:
        row["error"] = refused
    return row


LATENESS_KEYS = ("late_s_max", "late_fraction", "wall_s")


def lateness(before: dict[str, float], after: dict[str, float], elapsed_s: float) -> dict:
    """The worst simulated worker's lateness over a run: wall seconds its steps ended after their
    modelled end (`simworker_late_s_total` from /server_info, read before and after), and that as a
    share of the run's wall time. None when no worker reports it (real SGLang servers)."""
    lags = [after[url] - before[url] for url in after if url in before]
    worst = max(lags) if lags else None
    return {
        "late_s_max": None if worst is None else round(worst, 3),
        "late_fraction": None if worst is None or elapsed_s <= 0 else round(worst / elapsed_s, 5),
        "wall_s": round(elapsed_s, 2),
    }


def late_refusal(summary: dict, limit: float = LATE_FRACTION_LIMIT) -> str | None:
    """Why a live run cannot stand for its arm, or None: its workers fell behind their clock."""
    late = summary.get("late_fraction")
    if late is None or late <= limit:
        return None
    return (
        f"refused: the workers fell {late:.1%} behind their clock ({summary['late_s_max']:.2f}s over "
        f"{summary['wall_s']:.0f}s; limit {limit:.0%}): the machine set the pace, not the arm"
    )


# -------------------------------------------------------------------------------------- driver


def _job(args: tuple) -> tuple:
    """A picklable sim job for the process pool: (spec, arm, parallel, as_live) -> (workload, parallel, arm, row)."""
    spec, arm, parallel, as_live = args
    started = time.monotonic()
    try:
        row = twin_run(spec, arm, parallel) if as_live else sim_run(spec, arm, parallel)
    except Exception as exc:  # noqa: BLE001 - one failing arm is recorded, the sweep goes on
        row = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    row["elapsed_s"] = round(time.monotonic() - started, 2)
    return spec.workload, parallel, arm, row


def twin_run(spec: SweepSpec, arm: str, parallel: int) -> dict:
    """The live-sim twin of one arm at one point: of `spec.twin_draws` simulated runs of the live run
    (variants 1..N), the one with the median steps/min (the lower middle of an even count), with every
    draw's steps/min and KV hit rate beside it."""
    rows = {v: sim_run(spec, arm, parallel, as_live=True, variant=v) for v in range(1, spec.twin_draws + 1)}
    done = {v: r for v, r in rows.items() if "summary" in r and not r.get("error")}
    if not done:
        return rows[1]
    ordered = sorted(done.values(), key=lambda r: r["summary"]["steps_per_min"])
    row = ordered[(len(ordered) - 1) // 2]
    row["draws"] = [
        {"variant": v, "steps_per_min": r["summary"]["steps_per_min"], "kv_hit_rate": r["summary"]["kv_hit_rate"]}
        for v, r in done.items()
    ]
    return row


def new_sweep(mode: str, spec: SweepSpec, arms: Sequence[str]) -> dict:
    described = spec.describe()
    return {
        "mode": mode,
        "workload": spec.workload,
        "spec": described,
        "arms": list(arms),
        "points": [
            {"parallel": p, "programs": p * spec.programs_per_slot, "oversubscription": o, "arms": {}}
            for p, o in zip(spec.parallel, described["oversubscription"])
        ],
    }


def _point(sweep: dict, parallel: int) -> dict:
    return next(p for p in sweep["points"] if p["parallel"] == parallel)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _brief(row: dict) -> str:
    if "summary" not in row:
        return "ERROR " + row.get("error", "")
    s = row["summary"]
    extra = f" pauses {row['scheduler'].get('pauses')}" if row.get("scheduler") else ""
    late = (row.get("lateness") or {}).get("late_fraction")
    if late is not None:
        extra += f"  late {late:.2%}"
    err = f" ERROR {row['error']}" if row.get("error") else ""
    return (
        f"{s['steps_per_min']:8.1f} steps/min  KV hit {s['kv_hit_rate']:.3f}  TTFT p90 {s['ttft_p90_s']:.2f}s"
        f"{extra}  ({row.get('elapsed_s', 0):.0f}s){err}"
    )


def run_sim(
    sweeps: dict[str, dict], specs: dict[str, SweepSpec], save: Callable[[], None], jobs: int, *, as_live: bool = False
) -> None:
    work = [
        (specs[w], arm, p, as_live) for w, sweep in sweeps.items() for p in specs[w].parallel for arm in sweep["arms"]
    ]
    # The biggest runs first, so that a pool of several processes ends together.
    work.sort(key=lambda job: -job[2])
    done = 0

    def record(result: tuple) -> None:
        nonlocal done
        workload, parallel, arm, row = result
        _point(sweeps[workload], parallel)["arms"][arm] = row
        done += 1
        label = LIVE_SIM if as_live else "sim"
        _log(f"[{label} {done}/{len(work)}] {workload:5s} parallel {parallel:3d} {arm:22s} {_brief(row)}")
        save()

    if jobs <= 1:
        for job in work:
            record(_job(job))
        return
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for result in pool.map(_job, work):
            record(result)


def median_run(runs: Sequence[dict]) -> dict:
    """The row that stands for an arm at a live point: of its repeats that ran, the one with the
    median steps/min (the lower one of an even count), so every figure in it comes from one real run,
    plus `repeats`, the steps/min of every run in order (None for one that failed). A failed repeat
    makes the row an error too, so the sweep exits non-zero."""
    ran = [r for r in runs if "summary" in r]
    errors = [r["error"] for r in runs if r.get("error")]
    if not ran:
        row = dict(runs[-1])
    else:
        row = dict(sorted(ran, key=lambda r: r["summary"]["steps_per_min"])[(len(ran) - 1) // 2])
        row.pop("error", None)
    row["repeats"] = [r["summary"]["steps_per_min"] if "summary" in r else None for r in runs]
    if errors:
        row["error"] = f"{len(errors)} of {len(runs)} runs failed; first: {errors[0]}"[:300]
    return row


def run_live(
    sweeps: dict[str, dict],
    specs: dict[str, SweepSpec],
    save: Callable[[], None],
    log_dir: Path,
    repeats: int = 1,
    run: Callable[..., dict] | None = None,
) -> None:
    """Every (workload, point, arm) `repeats` times, round by round: each round runs every arm at
    every point once, so a slow spell of the machine falls on all arms alike. After every run the
    point's row is the median run so far (`median_run`) and the results are saved."""
    run = run or live_run
    work = [(w, p, arm) for w, sweep in sweeps.items() for p in specs[w].parallel for arm in sweep["arms"]]
    runs: dict[tuple, list[dict]] = {job: [] for job in work}
    total = len(work) * repeats
    n = 0
    for round_ in range(1, repeats + 1):
        for workload, parallel, arm in work:
            n += 1
            started = time.monotonic()
            try:
                row = run(specs[workload], arm, parallel, log_dir / f"{workload}-{parallel}-{arm}-{round_}")
            except Exception as exc:  # noqa: BLE001 - a stack that fails to start is recorded, the sweep goes on
                row = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            row["elapsed_s"] = round(time.monotonic() - started, 2)
            runs[(workload, parallel, arm)].append(row)
            _point(sweeps[workload], parallel)["arms"][arm] = median_run(runs[(workload, parallel, arm)])
            label = f"live {n}/{total}" + (f", round {round_}/{repeats}" if repeats > 1 else "")
            _log(f"[{label}] {workload:5s} parallel {parallel:3d} {arm:22s} {_brief(row)}")
            save()


def _git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parents[1],
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _csv(values: Iterable[str], allowed: Sequence[str], name: str) -> list[str]:
    out = [v.strip() for item in values for v in item.split(",") if v.strip()]
    unknown = [v for v in out if v not in allowed]
    if unknown:
        raise SystemExit(f"bench.compare: unknown {name} {', '.join(unknown)} (choose from {', '.join(allowed)})")
    return list(dict.fromkeys(out))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="sim", choices=("sim", "live", "both"))
    parser.add_argument("--workload", default="both", choices=("swe", "short", "both"))
    parser.add_argument("--out-dir", type=Path, default=Path("bench/results/agentic"))
    parser.add_argument("--smoke", action="store_true", help="tiny programs, 2 sim points, 1 live point")
    parser.add_argument(
        "--arms",
        action="append",
        default=[],
        help=f"comma list from {', '.join((*BASE_ARMS, BANDMASTER))} (default: all)",
    )
    parser.add_argument(
        "--pause-policy",
        action="append",
        default=[],
        help=f"Bandmaster arms' pause policies, comma list from {', '.join(PAUSE_POLICIES)} (default: all registered)",
    )
    parser.add_argument("--jobs", type=int, default=1, help="sim runs in parallel processes")
    parser.add_argument(
        "--live-repeats",
        type=int,
        default=None,
        help=f"live runs per arm and point, arms interleaved; the median run is reported "
        f"(default: {LIVE_REPEATS}, 1 with --smoke)",
    )
    parser.add_argument("--no-report", action="store_true", help="write results.json only")
    parser.add_argument(
        "--no-cache-report",
        action="store_true",
        help="live: start the simulated workers without --enable-cache-report (completions carry no cached-token "
        "counts), the degraded set-up the scheduler must survive",
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="live: record every run's spans and attach the per-turn wall-time breakdown to each run and to its "
        "simulated twin (costs the Bandmaster arms some CPU: leave it off for headline figures)",
    )
    parser.add_argument(
        "--live-points",
        default=None,
        help="live: comma list of parallel-program counts in place of the sweep's (e.g. 18 for the 4x point only)",
    )
    parser.add_argument(
        "--twin-draws",
        type=int,
        default=None,
        help="live: each arm's simulated twin at a point is the median of this many simulated runs, each with other "
        f"draws of the live path's per-turn costs (default {SweepSpec.twin_draws}, {SMOKE_TWIN_DRAWS} with --smoke)",
    )
    parser.add_argument(
        "--late-limit",
        type=float,
        default=None,
        help=f"live: refuse a run whose worst worker fell behind its clock by more than this share of the run's "
        f"wall time (default {LATE_FRACTION_LIMIT}; {SMOKE_LATE_LIMIT} with --smoke)",
    )
    parser.add_argument(
        "--trace",
        type=Path,
        default=None,
        help="SWE programs from this JSONL trace (shared/traces/swe_agent_trace.jsonl's format)",
    )
    parser.add_argument(
        "--split",
        default=DEFAULT_SPLIT,
        choices=SPLITS,
        help="part of the trace the SWE programs come from (default: tune)",
    )
    return parser


def live_sim_arms(live_arms: Sequence[str]) -> list[str]:
    """The arms simulated at a live sweep's points: every arm of it that the simulator models (not the
    live-only peers), the reference of the live ÷ sim checks; then the oracle, the bound each live arm is
    reported against (seconds of simulation). None when the simulator models no arm of the sweep."""
    modelled = [a for a in live_arms if a not in LIVE_ONLY_ARMS]
    return [*modelled, ORACLE] if modelled else []


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    repeats = args.live_repeats if args.live_repeats is not None else 1 if args.smoke else LIVE_REPEATS
    if repeats < 1:
        _log(f"bench.compare: --live-repeats must be >= 1, got {repeats}")
        return 2
    if args.twin_draws is not None and not 1 <= args.twin_draws <= 50:
        _log(f"bench.compare: --twin-draws must be from 1 to 50, got {args.twin_draws}")
        return 2
    if args.late_limit is not None and not 0 < args.late_limit < 1:
        _log(f"bench.compare: --late-limit must be in (0, 1), got {args.late_limit}")
        return 2
    live_points: tuple[int, ...] | None = None
    if args.live_points is not None:
        try:
            live_points = tuple(sorted({int(v) for v in args.live_points.split(",") if v.strip()}))
        except ValueError:
            live_points = ()
        if not live_points or live_points[0] < 1:
            _log(f"bench.compare: --live-points must be a comma list of counts >= 1, got {args.live_points!r}")
            return 2
    arms = _csv(args.arms, (*BASE_ARMS, BANDMASTER), "arm") or [*BASE_ARMS, BANDMASTER]
    policies = _csv(args.pause_policy, tuple(PAUSE_POLICIES), "pause policy") or list(PAUSE_POLICIES)
    modes = MODES if args.mode == "both" else (args.mode,)
    workloads = WORKLOADS if args.workload == "both" else (args.workload,)
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {
        "meta": {
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "git_commit": _git_commit(),
            "argv": list(sys.argv[1:] if argv is None else argv),
            "smoke": args.smoke,
            "machine": machine(),
            "pause_policies": policies,
            "live_repeats": repeats,
        },
        "sweeps": [],
    }
    path = out_dir / RESULTS_FILE

    def save() -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(results, indent=1))
        tmp.replace(path)

    source = dict(trace=None if args.trace is None else str(args.trace), split=args.split)
    try:
        for w in workloads:
            replace(specs_for("sim", args.smoke)[w], **source).programs(1)  # a bad trace fails here
    except ConfigError as exc:
        _log(f"bench.compare: {exc}")
        return 2
    started = time.monotonic()
    for mode in modes:
        specs = {w: replace(specs_for(mode, args.smoke)[w], **source) for w in workloads}
        if mode == "live":
            live_only: dict = {"cache_report": not args.no_cache_report, "breakdown": args.breakdown}
            if args.late_limit is not None:
                live_only["late_limit"] = args.late_limit
            live_only["twin_draws"] = (
                args.twin_draws
                if args.twin_draws is not None
                else SMOKE_TWIN_DRAWS
                if args.smoke
                else SweepSpec.twin_draws
            )
            if live_points is not None:
                live_only["parallel"] = live_points
            specs = {w: replace(spec, **live_only) for w, spec in specs.items()}
        mode_arms = arms_for(mode, arms, policies)
        sweeps = {w: new_sweep(mode, spec, mode_arms) for w, spec in specs.items()}
        results["sweeps"].extend(sweeps.values())
        for w, sweep in sweeps.items():
            s = sweep["spec"]
            turns = "full-length programs" if s["max_turns"] is None else f"{s['max_turns']} turns"
            _log(
                f"{mode} {w}: {s['workers']} workers x {s['worker_kv_tokens']} KV tokens, {turns}, "
                f"token scale {s['token_scale']}; mean peak context {s['mean_context_tokens']:.0f} -> "
                f"{s['fits_programs']:.1f} programs fit; points {s['parallel']} = {s['oversubscription']}x"
            )
        save()
        if mode == "sim":
            run_sim(sweeps, specs, save, args.jobs)
        else:
            # The simulator at the live points first (seconds): the reference of the live-ratio check.
            checked = live_sim_arms(mode_arms)
            if checked:
                twins = {w: new_sweep(LIVE_SIM, spec, checked) for w, spec in specs.items()}
                results["sweeps"].extend(twins.values())
                run_sim(twins, specs, save, args.jobs, as_live=True)
            with tempfile.TemporaryDirectory(prefix="bandmaster-compare-") as logs:
                run_live(sweeps, specs, save, Path(logs), repeats)
    from bench import report

    for sweep in results["sweeps"]:
        for point, ratios in zip(sweep["points"], report.oracle_ratios(sweep)):
            if ratios:
                point["ratio_to_oracle"] = ratios
    results["meta"]["elapsed_s"] = round(time.monotonic() - started, 1)
    save()
    _log(f"wrote {path}")
    errors = [
        (s["mode"], s["workload"], p["parallel"], arm)
        for s in results["sweeps"]
        for p in s["points"]
        for arm, row in p["arms"].items()
        if row.get("error")
    ]
    if not args.no_report:
        report.write_report(results, out_dir)
        print(report.targets_text(report.evaluate_targets(results)))
    for error in errors:
        _log(f"ERROR in {error}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
