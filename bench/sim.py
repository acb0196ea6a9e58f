"""`python -m bench.sim`: the offline simulator. The live bench's scenarios in virtual time, no processes.

It composes the real pure cores — the simworker engine (`SimEngine`), the router's KV cost model
(`KvRouterCore`) and the program scheduler (`SchedulerCore`) — in a discrete-event loop (see
harness/simlib/simulator.py and docs/simulator.md), and prints the same summary as `clients/player.py`
(`wall_s` and `simulated_minutes` are simulated time here), plus its own CPU cost.

    python -m bench.sim --arm bandmaster --workload swe --programs 256 --workers 8 \\
        --worker-kv-tokens 400000 --seed 0 --out report.json

Arms: `bandmaster` (scheduler core + router core), `kv` (router core only, as `bandmaster up
--no-scheduler`), `round_robin`, and `oracle`: the kv arm with effectively unlimited GPU KV
(nothing is ever evicted), the ceiling the others are measured against. Programs come from the
shipped SWE-agent trace or `--trace FILE` (JSONL in shared/traces/swe_agent_trace.jsonl's format),
its `--split` (tune by default: the held-out third is kept out of tuning), drawn `--draw
stratified|random`. `--mode steady` plays `--programs` through `--parallel` slots and also
reports `steady_steps_per_min` (warm-up and drain left out). Every flag of `python -m services.scheduler` that shapes
decisions is accepted (`--pause-threshold`, `--scheduler-interval-seconds`, `--pause-policy`,
`--cost-aware-*`, `--router-temperature`, `--kv-overlap-score-weight`, ...), in simulated seconds.
Python API: `simulate(SimScenario(...)) -> SimResult`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from clients.player import add_program_arguments
from harness.simlib import SimResult, SimScenario, simulate
from harness.simlib.live_path import LivePathCosts, costs_from_breakdown
from harness.simlib.scenario import ARMS, ROUTER_PROMPT_MODES, WORKLOADS
from services.common.settings.errors import ConfigError
from services.scheduler.config import load_config

__all__ = ["SimResult", "SimScenario", "simulate", "scenario_from_args", "main"]

MODES = ("closed", "steady")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.sim",
        description=__doc__.splitlines()[0],
        epilog="Scheduler control flags (see `python -m services.scheduler --help`) "
        "are passed through, in simulated seconds.",
    )
    parser.add_argument("--arm", default="bandmaster", choices=ARMS)
    parser.add_argument("--workload", default="swe", choices=WORKLOADS)
    parser.add_argument("--programs", type=int, default=8, help="programs in total")
    parser.add_argument("--parallel", type=int, default=0, help="programs in flight at once (default: all)")
    parser.add_argument(
        "--mode",
        default="closed",
        choices=MODES,
        help="closed: one batch, steps/min over the makespan; steady: --programs through "
        "--parallel slots, plus steps/min between warm-up and the last start",
    )
    add_program_arguments(parser)
    parser.add_argument("--max-turns", type=int, default=None)
    parser.add_argument("--token-scale", type=float, default=1.0)
    parser.add_argument("--tool-time-scale", type=float, default=1.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--worker-kv-tokens", type=int, default=65_536)
    parser.add_argument("--worker-host-kv-tokens", type=int, default=0)
    parser.add_argument("--worker-page-size", type=int, default=16)
    parser.add_argument("--timing-profile", default="glm45-fp8-h200")
    parser.add_argument(
        "--router-prompt",
        default="text",
        choices=ROUTER_PROMPT_MODES,
        help="text: the live router's text-chunk prompts; tokens: exact token pages (faster)",
    )
    parser.add_argument(
        "--live-speedup",
        type=float,
        default=1.0,
        help="model a live run at this simworker --speedup (router wall-clock constants scale)",
    )
    parser.add_argument(
        "--live-path",
        action="store_true",
        help="model the live stack's per-turn costs outside the engine (harness/simlib/live_path.py, "
        "calibrated wall seconds x --live-speedup); off: the offline figures",
    )
    parser.add_argument(
        "--live-path-from",
        type=Path,
        default=None,
        metavar="BREAKDOWN.json",
        help="model the live path with the mean costs of a live `python -m bench.breakdown --out` report "
        "(calibrated on your machine and load) instead of the defaults",
    )
    parser.add_argument(
        "--request-overhead-seconds",
        type=float,
        default=0.0,
        help="extra simulated seconds per turn before admission (client/router round trips)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the JSON report (summary, counters, timeline)")
    parser.add_argument("--no-turns", action="store_true", help="leave per-turn and per-program rows out of --out")
    return parser


def scenario_from_args(argv: Sequence[str]) -> tuple[SimScenario, argparse.Namespace]:
    """Flags -> a validated SimScenario. Other flags go to the scheduler service's own
    `load_config` (control law, --pause-policy and its cost_aware flags, the KvRouter flags it
    forwards to the router), which raises ConfigError for anything it does not know either."""
    args, rest = build_parser().parse_known_args(list(argv))
    scheduler = load_config(rest, {})
    live_path = LivePathCosts() if args.live_path else None
    if args.live_path_from is not None:
        try:
            live_path = costs_from_breakdown(json.loads(args.live_path_from.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError("live_path_from", str(args.live_path_from), f"a bench.breakdown report ({exc})") from None
    if args.mode == "steady" and not 1 <= args.parallel < args.programs:
        raise ConfigError("parallel", args.parallel, "--mode steady needs 1 <= --parallel < --programs")
    scenario = SimScenario(
        arm=args.arm,
        workload=args.workload,
        trace=None if args.trace is None else str(args.trace),
        split=args.split,
        draw=args.draw,
        include_longest=args.include_longest,
        programs=args.programs,
        parallel=args.parallel,
        max_turns=args.max_turns,
        token_scale=args.token_scale,
        tool_time_scale=args.tool_time_scale,
        seed=args.seed,
        workers=args.workers,
        worker_kv_tokens=args.worker_kv_tokens,
        worker_host_kv_tokens=args.worker_host_kv_tokens,
        worker_page_size=args.worker_page_size,
        worker_timing_profile=args.timing_profile,
        control=scheduler.control,
        pause_policy=scheduler.pause_policy,
        cost_aware=scheduler.cost_aware,
        kv_router=scheduler.kv_router,
        router_prompt=args.router_prompt,
        live_speedup=args.live_speedup,
        request_overhead_s=args.request_overhead_seconds,
        live_path=live_path,
    )
    return scenario, args


def main(argv: Sequence[str] | None = None) -> int:
    try:
        scenario, args = scenario_from_args(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        print(f"bench.sim: {exc}", file=sys.stderr)
        return 2
    result = simulate(scenario)
    report = result.report()
    if args.no_turns:
        report.pop("turns")
        report.pop("programs")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report["summary"], indent=1))
    return 0 if result.completed and report["summary"]["turns_failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
