"""`python -m bench.foresight`: what knowing each program's remaining turns would buy. A study, not a policy.

The scheduler decides who pauses and who runs first without knowing how much work a program has
left; tail protection guesses it from the turns run so far. The simulator knows the trace, so it
can hand the exact figure to the scheduler and the engines, which no deployment can. That bounds
what any predictor of remaining work could add, on the same draws as bench.evaluate's grid, each
variant against `kv` on the same draw:

    kv              KV routing (the baseline of every ratio)
    bandmaster      the adopted policy, as bench.evaluate runs it
    tail            + tail protection also covers the quarter of live programs with the most turns left
    tail+queue      + each turn's engine priority is its program's remaining turns (served first)
    kv+queue        KV routing with the same engine priority
    parking         Bandmaster with a GPU-only budget: the host tier holds paused contexts (needs --host)
    parking+tail    the same with foresight in tail protection

    python -m bench.foresight [--factor 3] [--draws 6] [--host] [--variants kv,bandmaster,tail] \\
        [--jobs 2] [--out FILE] [--quick]

Foresight reaches the scheduler and the engines by swapping three functions for the length of a
run (`_foresight`): nothing in the services changes. docs/benchmarks/agentic.md ("What knowing the
future would buy") gives the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Sequence

from bench.evaluate import FULL, QUICK, EvalSpec, Job, scenario_for
from clients.workloads import split_programs, trace_programs
from services.common.settings.config import require
from services.common.settings.errors import ConfigError
from services.scheduler.config import SchedulerConfig, load_config

TAIL_SHARE = 0.25  # the share of live programs, by turns left, that foresight protects
VARIANTS = ("kv", "bandmaster", "tail", "tail+queue", "kv+queue", "parking", "parking+tail")
HOST_ONLY = ("parking", "parking+tail")


@dataclass(frozen=True)
class Foresight:
    tail: bool = False
    queue: bool = False
    gpu_only_budget: bool = False


def variant_foresight(variant: str) -> tuple[str, Foresight]:
    """The arm a variant runs and what it is told."""
    arm = "kv" if variant.startswith("kv") else "bandmaster"
    return arm, Foresight(
        tail="tail" in variant, queue=variant.endswith("queue"), gpu_only_budget=variant.startswith("parking")
    )


@contextmanager
def _foresight(f: Foresight) -> Iterator[None]:
    """Within the block, the simulator tells the scheduler's tail test (noting each program's turns
    left at admission) and the engines' queue each program's remaining turns, and (gpu_only_budget)
    the capacity model counts no host tokens."""
    from harness.simlib import simulator as sim
    from services.capacity.core import cards
    from services.scheduler.core import accounting

    remaining: dict[str, int] = {}
    saved = (sim.Simulator._on_admit, sim.Simulator._on_arrive, accounting.Ledger.is_tail, cards.host_counted)
    on_admit, on_arrive, is_tail, _ = saved

    def admit(self, turn) -> None:
        remaining[sim.program_session(turn.run)] = len(turn.run.program.turns) - turn.k
        on_admit(self, turn)

    def tail(self, program) -> bool:
        left = sorted((remaining.get(sid, 0) for sid in self.programs), reverse=True)
        cut = left[min(max(1, round(TAIL_SHARE * len(left))), len(left)) - 1]
        return remaining.get(program.session_id, 0) >= cut or is_tail(self, program)

    def arrive(self, turn) -> None:
        decision = turn.decision
        turn.decision = _Told(len(turn.run.program.turns) - turn.k, getattr(decision, "replica", None))
        try:
            on_arrive(self, turn)
        finally:
            turn.decision = decision

    if f.tail:
        sim.Simulator._on_admit = admit
        accounting.Ledger.is_tail = tail
    if f.queue:
        sim.Simulator._on_arrive = arrive
    if f.gpu_only_budget:
        cards.host_counted = lambda card, settings: 0
    try:
        yield
    finally:
        sim.Simulator._on_admit, sim.Simulator._on_arrive, accounting.Ledger.is_tail, cards.host_counted = saved


@dataclass(frozen=True)
class _Told:
    """What the engine reads of a decision: its priority (here the turns left) and its replica."""

    priority: int
    replica: object


def run_one(args: tuple[str, int, EvalSpec, int, int, str | None, SchedulerConfig]) -> tuple[str, int, float]:
    from harness.simlib import simulate

    variant, draw, spec, factor, host, trace, scheduler = args
    arm, told = variant_foresight(variant)
    parallel = spec.parallel(factor)
    job = Job("host" if host else "closed", "tune", factor, draw, arm, parallel, parallel, 1.0, host)
    with _foresight(told):
        summary = simulate(scenario_for(job, spec, trace, scheduler)).summary()
    if summary["turns_failed"]:
        raise RuntimeError(f"{variant} draw {draw}: {summary['turns_failed']} turns failed")
    return variant, draw, summary["steps_per_min"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.foresight", description=__doc__.split("\n\n")[0])
    p.add_argument("--factor", type=int, default=3, help="oversubscription (programs = factor x what fits)")
    p.add_argument("--draws", type=int, default=None, help="draws of the tuning split (default: the grid's)")
    p.add_argument("--host", action="store_true", help="a host tier of the grid's size (4x the GPU pool)")
    p.add_argument("--variants", default=None, help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--trace", default=None, help="a JSONL trace in the shipped format")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    p.add_argument("--quick", action="store_true", help="tiny programs on tiny workers (the test suite's)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args, rest = build_parser().parse_known_args(sys.argv[1:] if argv is None else argv)
    try:
        scheduler = load_config(rest, {})
        spec = QUICK if args.quick else FULL
        spec = replace(spec, draws=spec.draws if args.draws is None else args.draws)
        require(spec.draws >= 1, "draws", spec.draws, "draws >= 1")
        require(args.factor >= 1, "factor", args.factor, "factor >= 1")
        require(args.jobs >= 1, "jobs", args.jobs, "jobs >= 1")
        default = VARIANTS if args.host else tuple(v for v in VARIANTS if v not in HOST_ONLY)
        variants = [v for v in (args.variants or ",".join(default)).split(",") if v]
        unknown = [v for v in variants if v not in VARIANTS]
        require(not unknown, "variants", unknown, f"each of {', '.join(VARIANTS)}")
        require(args.host or not set(variants) & set(HOST_ONLY), "variants", variants, "parking variants need --host")
        if "kv" not in variants:
            variants.insert(0, "kv")
        spec = spec.with_fits(split_programs(trace_programs(args.trace), "tune"))
    except ConfigError as exc:
        print(f"bench.foresight: {exc}", file=sys.stderr)
        return 2
    host = spec.host_kv_factor * spec.worker_kv_tokens if args.host else 0
    work = [(v, d, spec, args.factor, host, args.trace, scheduler) for v in variants for d in range(spec.draws)]
    if args.jobs > 1:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            results = list(pool.map(run_one, work))
    else:
        results = [run_one(w) for w in work]
    steps = {(v, d): s for v, d, s in results}
    kv = [steps["kv", d] for d in range(spec.draws)]
    rows = {}
    title = f"{args.factor}x, {spec.parallel(args.factor)} programs" + (
        f", host tier {host:,} tokens/worker" if host else ""
    )
    print(f"bench.foresight: tuning split, {title}; steps/min per draw, then mean ÷ kv (worst)")
    for v in variants:
        ratios = [steps[v, d] / kv[d] for d in range(spec.draws)]
        rows[v] = {"steps_per_min": [steps[v, d] for d in range(spec.draws)], "ratio_to_kv": ratios}
        cells = " ".join(f"{steps[v, d]:6.1f}" for d in range(spec.draws))
        print(f"  {v:13s} {cells}   {statistics.fmean(ratios):.3f} ({min(ratios):.3f})")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        meta = {"factor": args.factor, "draws": spec.draws, "host_kv_tokens": host, "quick": args.quick}
        args.out.write_text(json.dumps({"meta": meta, "tail_share": TAIL_SHARE, "variants": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
