"""`python -m bench.evaluate`: Bandmaster against the ceiling and against KV routing, over many draws.

    python -m bench.evaluate [--quick] [--jobs 2] [--draws 6] [--heldout-draws 3] [--points 2,3,4] \\
        [--arms bandmaster,kv,oracle] [--groups closed,tool_x3,...] [--split tune|heldout|all] \\
        [--trace FILE] [--out-dir bench/results/agentic] [scheduler flags: --pause-policy ... --cost-aware-* ...]

The grid (simulator only; SWE programs on 2 workers x 128K KV tokens, as bench.compare's sweep).
A point's factor is its oversubscription: programs = factor x the programs that fit (the pool over
the mean peak context of the trace's tuning part: 6.0 on the shipped trace, so 12 / 18 / 24):

| group | split | points | what changes |
|---|---|---|---|
| closed | tune | 2x, 3x, 4x | all programs start at once; steps/min over the makespan |
| tool_x3, tool_x10 | tune | 3x | every tool time x3, x10 |
| host | tune | 3x, 4x | a host KV tier of 4x the GPU pool per worker (the oracle gets the same tier) |
| steady | tune | 3x | 3 programs per slot (54 through 18 slots); steps/min between warm-up and the last start |
| heldout | heldout | 2x, 3x, 4x | the closed batch on the held-out programs, fewer draws |

Every point runs the arms `bandmaster` (the scheduler service's defaults, or the scheduler flags
given here), `kv` (router only) and `oracle` (kv with unlimited KV, harness.simlib) on `draws`
random draws of programs (uniform with replacement from the split; draw d has seed d, and draw 0
always holds the split's longest program). Per draw the ratios bandmaster/oracle, bandmaster/kv and
kv/oracle are taken on the same programs; per point the report gives their mean and worst (lowest)
over the draws, and the targets as PASS/MISS. Output: `<out-dir>/evaluate.json` (rewritten after
every run) and `<out-dir>/evaluate.md`. `--quick` is a tiny grid (small programs, 2 draws) for tests.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from bench.machine import machine
from bench.report import Target, targets_text
from clients.workloads import SPLITS, Program, scale, split_programs, trace_programs
from services.common.settings.config import require
from services.common.settings.errors import ConfigError
from services.scheduler.config import SchedulerConfig, load_config

ARMS = ("bandmaster", "kv", "oracle")
# The peer systems' arms (harness/peers): selectable with --arms, not run by default.
PEER_ARMS = ("thunderagent", "continuum")
RATIOS = (
    ("bandmaster", "oracle"),
    ("bandmaster", "kv"),
    ("kv", "oracle"),
    ("bandmaster", "thunderagent"),
    ("bandmaster", "continuum"),
)
GROUPS = ("closed", "tool_x3", "tool_x10", "host", "steady", "heldout")
JSON_FILE = "evaluate.json"
MARKDOWN_FILE = "evaluate.md"

# The targets (issue 10).
ORACLE_SHARE = 0.85  # bandmaster >= 0.85x oracle, mean over draws, at 2-3x
ORACLE_FACTORS = (2, 3)
KV_SPEEDUP = 1.4  # bandmaster >= 1.4x kv, mean over draws, at 3x
KV_SPEEDUP_FACTORS = (3,)
NEVER_BELOW_KV = 0.97  # bandmaster >= 0.97x kv in every run of every group
HOST_SPEEDUP = 1.1  # with a host tier, bandmaster >= 1.1x kv (same tier), mean over draws, at 3-4x
HOST_FACTORS = (3, 4)


@dataclass(frozen=True)
class EvalSpec:
    """The grid's fixed shape. Counts of programs are factor x `fits_programs`, rounded."""

    workers: int = 2
    worker_kv_tokens: int = 131_072
    max_turns: int | None = None
    token_scale: float = 1.0
    fits_programs: float | None = None
    """Programs whose peak contexts fit the workers' pool at once; None = the pool / the mean peak
    context of the trace's programs (the part the grid tunes on): 2 x 128K / 43.4K = 6.0 on the
    shipped trace, so 2x, 3x, 4x = 12, 18, 24 programs."""
    factors: tuple[int, ...] = (2, 3, 4)
    """Oversubscription factors of the closed-batch points."""
    draws: int = 6
    heldout_draws: int = 3
    tool_scales: tuple[int, ...] = (3, 10)
    tool_factor: int = 3
    host_kv_factor: int = 4
    """Host tier per worker = this x worker_kv_tokens."""
    host_factors: tuple[int, ...] = (3, 4)
    steady_factor: int = 3
    steady_programs_per_slot: int = 3

    def __post_init__(self) -> None:
        require(self.workers >= 1, "workers", self.workers, "workers >= 1")
        require(
            self.fits_programs is None or self.fits_programs > 0,
            "fits_programs",
            self.fits_programs,
            "fits_programs is None or > 0",
        )
        require(
            len(self.factors) >= 1 and all(f >= 1 for f in self.factors),
            "points",
            self.factors,
            "at least one factor, every factor >= 1",
        )
        require(self.draws >= 1, "draws", self.draws, "draws >= 1")
        require(self.heldout_draws >= 1, "heldout_draws", self.heldout_draws, "heldout_draws >= 1")
        # The window runs from the P-th program's end to the last program's start, which is the
        # end of program N - P: it is empty unless N >= 3P.
        require(
            self.steady_programs_per_slot >= 3,
            "steady_programs_per_slot",
            self.steady_programs_per_slot,
            "steady_programs_per_slot >= 3 (with fewer the last program starts before warm-up ends)",
        )

    def parallel(self, factor: int) -> int:
        require(self.fits_programs is not None, "fits_programs", None, "resolved (with_fits) before the grid is built")
        return max(1, round(factor * self.fits_programs))

    def with_fits(self, programs: Sequence[Program]) -> "EvalSpec":
        """This spec with `fits_programs` resolved from `programs` (at this spec's scale) if unset."""
        if self.fits_programs is not None:
            return self
        scaled = scale(programs, token_scale=self.token_scale, max_turns=self.max_turns)
        mean_peak = statistics.fmean(p.peak_context_tokens for p in scaled)
        return replace(self, fits_programs=round(self.workers * self.worker_kv_tokens / mean_peak, 2))


FULL = EvalSpec()
# Tiny programs on tiny workers: every group and arm in seconds (the test suite's version).
QUICK = EvalSpec(
    worker_kv_tokens=1_024,
    max_turns=3,
    token_scale=0.05,
    fits_programs=2.0,
    factors=(2, 3),
    draws=2,
    heldout_draws=1,
    host_factors=(3,),
)


@dataclass(frozen=True)
class Job:
    """One simulated run of the grid (picklable, for the process pool)."""

    group: str
    split: str
    factor: int
    draw: int
    arm: str
    programs: int
    parallel: int
    tool_time_scale: float
    host_kv_tokens: int

    @property
    def point(self) -> str:
        return f"{self.group}@{self.factor}x"


def build_jobs(
    spec: EvalSpec,
    groups: Sequence[str],
    factors: Sequence[int],
    arms: Sequence[str],
    tune_split: str,
    draws: int,
    heldout_draws: int,
) -> list[Job]:
    """The grid as jobs. `tune_split` is the split of every group but `heldout` (tune, or all for a
    trace scored as a whole); `factors` restricts every group's points."""
    out = []

    def add(
        group: str, split: str, factor: int, n_draws: int, *, tool: float = 1.0, host: int = 0, per_slot: int = 1
    ) -> None:
        if factor not in factors:
            return
        parallel = spec.parallel(factor)
        for draw in range(n_draws):
            for arm in arms:
                out.append(Job(group, split, factor, draw, arm, parallel * per_slot, parallel, tool, host))

    for factor in spec.factors:
        if "closed" in groups:
            add("closed", tune_split, factor, draws)
    for tool_scale in spec.tool_scales:
        if f"tool_x{tool_scale}" in groups:
            add(f"tool_x{tool_scale}", tune_split, spec.tool_factor, draws, tool=float(tool_scale))
    if "host" in groups:
        for factor in spec.host_factors:
            add("host", tune_split, factor, draws, host=spec.host_kv_factor * spec.worker_kv_tokens)
    if "steady" in groups:
        add("steady", tune_split, spec.steady_factor, draws, per_slot=spec.steady_programs_per_slot)
    if "heldout" in groups:
        for factor in spec.factors:
            add("heldout", "heldout", factor, heldout_draws)
    return out


def scenario_for(job: Job, spec: EvalSpec, trace: str | None, scheduler: SchedulerConfig):
    """The SimScenario of a job. The scheduler flags reach the Bandmaster arm only (the kv arm is
    `bandmaster up --no-scheduler`, whose router keeps its own defaults)."""
    from harness.simlib import SimScenario

    flags = {}
    if job.arm == "bandmaster":
        flags = dict(
            control=scheduler.control,
            pause_policy=scheduler.pause_policy,
            cost_aware=scheduler.cost_aware,
            kv_router=scheduler.kv_router,
        )
    return SimScenario(
        arm=job.arm,
        workload="swe",
        trace=trace,
        split=job.split,
        draw="random",
        include_longest=job.draw == 0,
        seed=job.draw,
        programs=job.programs,
        parallel=job.parallel if job.programs > job.parallel else 0,
        max_turns=spec.max_turns,
        token_scale=spec.token_scale,
        tool_time_scale=job.tool_time_scale,
        workers=spec.workers,
        worker_kv_tokens=spec.worker_kv_tokens,
        worker_host_kv_tokens=job.host_kv_tokens,
        # Exact token pages: cheaper than the live router's text chunks, same cost formula and the
        # same relative figures (docs/simulator.md, "Prompts").
        router_prompt="tokens",
        **flags,
    )


def run_job(args: tuple) -> tuple[Job, dict]:
    """One run -> (job, row). The row's `metric` is what the ratios compare: steps/min over the
    makespan, or in the steady group steps/min between warm-up and the last start."""
    from harness.simlib import simulate

    job, spec, trace, scheduler = args
    started = time.monotonic()
    try:
        scenario = scenario_for(job, spec, trace, scheduler)
        result = simulate(scenario)
        s = result.summary()
        metric = s["steady_steps_per_min"] if job.group == "steady" else s["steps_per_min"]
        programs = scenario.build_programs()
        row = {
            "metric": metric,
            "steps_per_min": s["steps_per_min"],
            "steady_steps_per_min": s["steady_steps_per_min"],
            "kv_hit_rate": s["kv_hit_rate"],
            "ttft_p90_s": s["ttft_p90_s"],
            "turns_ok": s["turns_ok"],
            "turns_failed": s["turns_failed"],
            "simulated_minutes": s["simulated_minutes"],
            "evicted_tokens": s["worker_evicted_tokens"],
            "pauses": result.scheduler_counters.get("pauses"),
            "sim_cpu_s": s["sim_cpu_s"],
            "longest_turns": max(len(p.turns) for p in programs),
            "mean_peak_context_tokens": round(statistics.fmean(p.peak_context_tokens for p in programs), 1),
        }
        if s.get("oracle_worker_kv_tokens") is not None:
            row["oracle_worker_kv_tokens"] = s["oracle_worker_kv_tokens"]
        if not result.completed or s["turns_failed"] or metric is None:
            row["error"] = (
                "the simulation hit its horizon"
                if not result.completed
                else f"{s['turns_failed']} turns failed"
                if s["turns_failed"]
                else "no steady-state window"
            )
    except Exception as exc:  # noqa: BLE001 - one failing run is recorded, the grid goes on
        row = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    row["elapsed_s"] = round(time.monotonic() - started, 2)
    return job, row


def relative_cost(job: Job) -> float:
    """A run's CPU cost in units of a closed-batch kv run at 3x (about 5 CPU seconds), from
    single-run timings (docs/benchmarks/agentic.md, "Cost"): about linear in programs, the kv arm
    (the most recompute) nearly twice the others, and a host tier (write-back and load-back of
    evicted pages) several times more, except for the oracle, which never evicts. Only the order
    of the runs depends on it."""
    cost = job.programs / 18 * (1.0 if job.arm == "kv" else 0.6)
    return cost * (6.0 if job.host_kv_tokens and job.arm != "oracle" else 1.0)


# ------------------------------------------------------------------------------------ aggregation


def _key(job: Job) -> tuple:
    return job.group, job.factor


def aggregate(jobs: Sequence[Job], rows: dict[Job, dict]) -> list[dict]:
    """Per point (group x factor): per draw the metric of every arm and the ratios, then the mean
    and the worst (lowest) ratio over the draws where both arms ran."""
    points: dict[tuple, dict] = {}
    for job in jobs:
        point = points.setdefault(
            _key(job),
            {
                "group": job.group,
                "split": job.split,
                "factor": job.factor,
                "programs": job.programs,
                "parallel": job.parallel,
                "tool_time_scale": job.tool_time_scale,
                "host_kv_tokens": job.host_kv_tokens,
                "draws": {},
            },
        )
        row = rows.get(job)
        if row is not None:
            point["draws"].setdefault(job.draw, {})[job.arm] = row
    out = []
    for point in points.values():
        ratios = {}
        for a, b in RATIOS:
            values = []
            for draw, arms in sorted(point["draws"].items()):
                ra, rb = arms.get(a), arms.get(b)
                if ra and rb and not ra.get("error") and not rb.get("error") and rb["metric"]:
                    values.append((ra["metric"] / rb["metric"], draw))
            if values:
                worst = min(values)
                ratios[f"{a}/{b}"] = {
                    "mean": round(statistics.fmean(v for v, _ in values), 4),
                    "worst": round(worst[0], 4),
                    "worst_draw": worst[1],
                    "draws": len(values),
                    "values": [round(v, 4) for v, _ in values],
                }
        point["ratios"] = ratios
        point["draws"] = {str(d): arms for d, arms in sorted(point["draws"].items())}
        out.append(point)
    return out


def _find(points: Sequence[dict], group: str, factors: Sequence[int]) -> list[dict]:
    return [p for p in points if p["group"] == group and p["factor"] in factors]


def _mean_target(
    points: Sequence[dict], group: str, factors: Sequence[int], ratio: str, name: str, threshold: float, expected: int
) -> Target:
    """The lowest mean over draws among the covered points (N/A if a point or its ratio is missing)."""
    chosen = _find(points, group, factors)
    have = [(p["ratios"][ratio]["mean"], p["factor"]) for p in chosen if ratio in p["ratios"]]
    if not have or len(have) < expected:
        return Target("sim", "swe", "bandmaster", name, threshold, None, list(factors), "missing points or arms")
    worst = min(have)
    detail = "; ".join(f"{f}x mean {m:.3f}" for m, f in sorted(have, key=lambda x: x[1]))
    return Target(
        "sim", "swe", "bandmaster", name, threshold, worst[0], [f for _, f in have], f"{detail} (lowest at {worst[1]}x)"
    )


def _worst_target(points: Sequence[dict], group: str, name: str, threshold: float) -> Target | None:
    chosen = [p for p in points if p["group"] == group and "bandmaster/kv" in p["ratios"]]
    if not any(p["group"] == group for p in points):
        return None
    if not chosen:
        return Target("sim", "swe", "bandmaster", name, threshold, None, [], "missing arms")
    worst = min(chosen, key=lambda p: p["ratios"]["bandmaster/kv"]["worst"])
    r = worst["ratios"]["bandmaster/kv"]
    return Target(
        "sim",
        "swe",
        "bandmaster",
        name,
        threshold,
        r["worst"],
        [p["factor"] for p in chosen],
        f"worst at {worst['factor']}x, draw {r['worst_draw']} (mean there {r['mean']:.3f})",
    )


def evaluate_targets(points: Sequence[dict], factors: Sequence[int]) -> list[Target]:
    """The issue's targets over the grid's points (N/A where the run did not cover them)."""
    out = []
    for group, label in (("closed", "tune"), ("heldout", "held-out")):
        if not any(p["group"] == group for p in points):
            continue
        f_oracle = [f for f in ORACLE_FACTORS if f in factors]
        f_kv = [f for f in KV_SPEEDUP_FACTORS if f in factors]
        if f_oracle:
            out.append(
                _mean_target(
                    points,
                    group,
                    f_oracle,
                    "bandmaster/oracle",
                    f"{label}, closed batch, 2-3x: mean over draws >= {ORACLE_SHARE}x oracle",
                    ORACLE_SHARE,
                    len(f_oracle),
                )
            )
        if f_kv:
            out.append(
                _mean_target(
                    points,
                    group,
                    f_kv,
                    "bandmaster/kv",
                    f"{label}, closed batch, 3x: mean over draws >= {KV_SPEEDUP}x kv",
                    KV_SPEEDUP,
                    len(f_kv),
                )
            )
    f_host = [f for f in HOST_FACTORS if f in factors]
    if any(p["group"] == "host" for p in points) and f_host:
        out.append(
            _mean_target(
                points,
                "host",
                f_host,
                "bandmaster/kv",
                f"host tier, 3-4x: mean over draws >= {HOST_SPEEDUP}x kv with the same tier",
                HOST_SPEEDUP,
                len(f_host),
            )
        )
    for group in GROUPS:
        target = _worst_target(
            points, group, f"never below kv ({group}): every draw >= {NEVER_BELOW_KV}x kv", NEVER_BELOW_KV
        )
        if target is not None:
            out.append(target)
    return out


# ------------------------------------------------------------------------------------ markdown


def _ratio_cell(ratios: dict, key: str) -> str:
    r = ratios.get(key)
    return "-" if r is None else f"{r['mean']:.3f} / {r['worst']:.3f}"


def _point_label(point: dict) -> str:
    label = f"{point['group']} {point['factor']}x ({point['programs']} programs"
    if point["parallel"] != point["programs"]:
        label += f" through {point['parallel']} slots"
    if point["host_kv_tokens"]:
        label += f", host tier {point['host_kv_tokens']:,} tokens/worker"
    return label + ")"


def summary_markdown(report: dict) -> str:
    meta = report["meta"]
    lines = [
        "# Bandmaster against the oracle and KV routing, over many draws",
        "",
        f"Generated by `python -m bench.evaluate {' '.join(meta.get('argv', []))}` at commit "
        f"`{meta.get('git_commit', '?')}` on {meta.get('created', '?')} in {meta.get('elapsed_s', '?')} s"
        + (" (quick)" if meta.get("quick") else "")
        + ".",
        "",
        f"SWE programs from {meta['trace'] or 'the shipped trace'}; {meta['spec']['workers']} workers x "
        f"{meta['spec']['worker_kv_tokens']:,} KV tokens; Bandmaster: pause policy `{meta['pause_policy']}`"
        f"{' with flags ' + ' '.join(meta['scheduler_flags']) if meta['scheduler_flags'] else ''}. "
        "Cells: mean / worst ratio of steps/min over the draws (steady: steps/min between warm-up and the "
        "last program's start); the same programs for every arm of a draw.",
        "",
        "| point | split | draws | bandmaster / oracle | bandmaster / kv | kv / oracle | steps/min (mean): "
        "bandmaster / kv / oracle |",
        "|---|---|---|---|---|---|---|",
    ]
    for point in report["points"]:
        draws = point["draws"]

        def mean_metric(arm: str, draws: dict = draws) -> str:
            values = [d[arm]["metric"] for d in draws.values() if arm in d and not d[arm].get("error")]
            return f"{statistics.fmean(values):.1f}" if values else "-"

        lines.append(
            f"| {_point_label(point)} | {point['split']} | {len(draws)} | "
            f"{_ratio_cell(point['ratios'], 'bandmaster/oracle')} | "
            f"{_ratio_cell(point['ratios'], 'bandmaster/kv')} | {_ratio_cell(point['ratios'], 'kv/oracle')} "
            f"| {' / '.join(mean_metric(a) for a in ARMS)} |"
        )
    peers = [a for a in PEER_ARMS if any(a in d for point in report["points"] for d in point["draws"].values())]
    if peers:
        lines += [
            "",
            'Peer arms (harness/peers, docs/simulator.md "Peer arms"): bandmaster / peer, mean / worst over the '
            "draws, and the peer's steps/min (mean).",
            "",
            "| point | " + " | ".join(f"bandmaster / {a} | {a} steps/min" for a in peers) + " |",
            "|---|" + "---|---|" * len(peers),
        ]
        for point in report["points"]:
            cells = []
            for a in peers:
                values = [d[a]["metric"] for d in point["draws"].values() if a in d and not d[a].get("error")]
                mean = f"{statistics.fmean(values):.1f}" if values else "-"
                cells += [_ratio_cell(point["ratios"], f"bandmaster/{a}"), mean]
            lines.append(f"| {_point_label(point)} | " + " | ".join(cells) + " |")
    lines += ["", "## Targets", "", "| result | target | value | needs | where |", "|---|---|---|---|---|"]
    for t in report["targets"]:
        value = "-" if t["value"] is None else f"{t['value']:.3f}"
        lines.append(f"| {t['status']} | {t['name']} | {value} | {t['needs']} | {t['detail']} |")
    errors = report.get("errors") or []
    if errors:
        lines += ["", f"{len(errors)} runs failed: " + "; ".join(errors[:10])]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------ driver


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


def _csv(values: Sequence[str], allowed: Sequence, name: str, cast: Callable = str) -> list:
    out = []
    for item in values:
        for v in item.split(","):
            v = v.strip().removesuffix("x") if cast is int else v.strip()
            if not v:
                continue
            try:
                value = cast(v)
            except ValueError:
                raise ConfigError(name, v, f"expected a comma list from {', '.join(map(str, allowed))}") from None
            if value not in allowed:
                raise ConfigError(name, v, f"expected a comma list from {', '.join(map(str, allowed))}")
            out.append(value)
    return list(dict.fromkeys(out))


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.evaluate",
        description=__doc__.splitlines()[0],
        epilog="Other flags are the scheduler's (`python -m services.scheduler --help`: --pause-policy, "
        "--cost-aware-*, --pause-threshold, ...), in simulated seconds; they apply to the Bandmaster arm.",
    )
    parser.add_argument("--quick", action="store_true", help="tiny programs and 2 draws (seconds; for tests)")
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel processes")
    parser.add_argument("--draws", type=int, default=None, help="draws per point (default 6; quick 2)")
    parser.add_argument("--heldout-draws", type=int, default=None, help="draws per held-out point (default 3)")
    parser.add_argument(
        "--points",
        action="append",
        default=[],
        help="oversubscription factors to run, comma list (default: all of 2,3,4)",
    )
    parser.add_argument(
        "--arms",
        action="append",
        default=[],
        help=f"comma list from {', '.join((*ARMS, *PEER_ARMS))} (default: {', '.join(ARMS)})",
    )
    parser.add_argument(
        "--groups", action="append", default=[], help=f"comma list from {', '.join(GROUPS)} (default: all)"
    )
    parser.add_argument(
        "--split",
        default=None,
        choices=SPLITS,
        help="run one split only: tune (every group but heldout), heldout (the heldout group), "
        "or all (every group but heldout, on all the trace's programs). Default: tune + heldout",
    )
    parser.add_argument(
        "--trace",
        type=Path,
        default=None,
        help="JSONL trace in shared/traces/swe_agent_trace.jsonl's format (default: the shipped one)",
    )
    parser.add_argument("--out-dir", type=Path, default=Path("bench/results/agentic"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, rest = build_parser().parse_known_args(argv)
    try:
        scheduler = load_config(rest, {})
        spec = QUICK if args.quick else FULL
        spec = replace(
            spec,
            draws=spec.draws if args.draws is None else args.draws,
            heldout_draws=spec.heldout_draws if args.heldout_draws is None else args.heldout_draws,
        )
        require(args.jobs >= 1, "jobs", args.jobs, "jobs >= 1")
        factors = _csv(args.points, spec.factors, "points", int) or list(spec.factors)
        arms = _csv(args.arms, (*ARMS, *PEER_ARMS), "arms") or list(ARMS)
        groups = _csv(args.groups, GROUPS, "groups") or list(GROUPS)
        if args.split == "heldout":
            groups = [g for g in groups if g == "heldout"]
        elif args.split in ("tune", "all"):
            groups = [g for g in groups if g != "heldout"]
        trace = None if args.trace is None else str(args.trace)
        tune_split = "all" if args.split == "all" else "tune"
        for split in {tune_split, "heldout"} if "heldout" in groups else {tune_split}:
            require(
                split_programs(trace_programs(trace), split),
                "split",
                split,
                f"the {split!r} part of {trace or 'the shipped trace'} holds no programs",
            )
        # Program counts come from the tuning part (or all), for the held-out group too, so that
        # its points are the same loads.
        programs = trace_programs(trace)
        spec = spec.with_fits(split_programs(programs, tune_split) or split_programs(programs, "heldout"))
    except ConfigError as exc:
        _log(f"bench.evaluate: {exc}")
        return 2
    jobs = build_jobs(spec, groups, factors, arms, tune_split, spec.draws, spec.heldout_draws)
    if not jobs:
        _log("bench.evaluate: nothing to run (check --points, --groups and --split)")
        return 2
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {
        "meta": {
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "git_commit": _git_commit(),
            "argv": argv,
            "quick": args.quick,
            "trace": trace,
            "spec": asdict(spec),
            "factors": factors,
            "arms": arms,
            "groups": groups,
            "fits_programs": spec.fits_programs,
            "pause_policy": scheduler.pause_policy,
            "scheduler_flags": rest,
            "machine": machine(),
            "runs": len(jobs),
        },
        "points": [],
        "targets": [],
        "errors": [],
    }
    rows: dict[Job, dict] = {}
    path = out_dir / JSON_FILE

    def save() -> None:
        report["points"] = aggregate(jobs, rows)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=1))
        tmp.replace(path)

    _log(
        f"bench.evaluate: {len(jobs)} runs ({', '.join(groups)}; points {factors}; arms {', '.join(arms)}; "
        f"{spec.draws} draws, held-out {spec.heldout_draws}) with {args.jobs} processes"
    )
    started = time.monotonic()
    # The costliest runs first, so that the pool's processes end together.
    work = sorted(jobs, key=lambda j: (-relative_cost(j), j.group, j.factor, j.draw, j.arm))
    payloads = [(job, spec, trace, scheduler) for job in work]
    done = 0

    def record(job: Job, row: dict) -> None:
        nonlocal done
        rows[job] = row
        done += 1
        if row.get("error"):
            report["errors"].append(f"{job.point} draw {job.draw} {job.arm}: {row['error']}")
        brief = row.get("error") or f"{row['metric']:.1f} steps/min, KV hit {row['kv_hit_rate']:.3f}"
        _log(f"[{done}/{len(jobs)}] {job.point:12s} draw {job.draw} {job.arm:10s} {brief} ({row['elapsed_s']:.0f}s)")
        save()

    if args.jobs <= 1:
        for payload in payloads:
            record(*run_job(payload))
    else:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            for job, row in pool.map(run_job, payloads):
                record(job, row)
    report["meta"]["elapsed_s"] = round(time.monotonic() - started, 1)
    points = aggregate(jobs, rows)
    targets = evaluate_targets(points, factors)
    report["points"] = points
    report["targets"] = [{**asdict(t), "status": t.status, "needs": t.needs} for t in targets]
    save()
    (out_dir / MARKDOWN_FILE).write_text(summary_markdown(report))
    _log(f"wrote {path} and {out_dir / MARKDOWN_FILE}")
    print(targets_text(targets))
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
