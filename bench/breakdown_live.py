"""`python -m bench.breakdown_live`: one live point with span files on, its per-turn breakdown, and the
same point simulated (plain and with the live path model), with live ÷ simulated steps/min.

    python -m bench.breakdown_live --arm kv --programs 24 --max-turns 16 --speedup 4 --out-dir DIR

Starts the arm's stack as `bandmaster up` would (services.launcher.cluster: 2 simworkers of --worker-kv-tokens
at --speedup, capacity, router, and for `bandmaster` the scheduler with its default policy) on free
ports, inside `bench.breakdown.LiveSpans`, plays the SWE programs of the tuning split closed loop at
full token counts (clients/player.py), stops the stack, and simulates the same programs with the
control law and router clocks of that speedup (`live_control_params`, `live_speedup`, text prompts).
Writes DIR/<arm>/report.json (summaries, breakdowns, ratios) and DIR/<arm>/spans/; prints the tables.
Keep points short on a shared machine: the live run takes its simulated makespan / --speedup.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from bench.breakdown import LiveSpans, breakdown_from_sim, format_table
from clients.player import Runner, build_workload
from harness.simlib import SimScenario, Simulator, live_control_params
from harness.simlib.live_path import LivePathCosts
from services.common.settings.errors import ConfigError
from services.scheduler.core.defaults import SERVICE_DEFAULT_PAUSE_POLICY

MODEL = "bandmaster-sim"
ARMS = ("kv", "bandmaster")
KEYS = ("steps_per_min", "turns_ok", "turns_failed", "wall_s", "kv_hit_rate", "ttft_p50_s")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.breakdown_live", description=__doc__.splitlines()[0])
    parser.add_argument("--arm", default="kv", choices=ARMS)
    parser.add_argument("--programs", type=int, default=12)
    parser.add_argument("--max-turns", type=int, default=8)
    parser.add_argument("--speedup", type=float, default=4.0)
    parser.add_argument("--worker-kv-tokens", type=int, default=65_536)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, required=True)
    return parser


def _live(args: argparse.Namespace, programs: list, out: Path) -> tuple[dict, dict]:
    from bench.peers import chat_ok
    from services.launcher.cluster import ClusterConfig, start_cluster
    from services.launcher.probes import wait_for_workers

    spans = LiveSpans(out / "spans")
    with spans:
        cluster = start_cluster(
            ClusterConfig(
                workers=2,
                worker_kv_tokens=args.worker_kv_tokens,
                worker_speedup=args.speedup,
                model_name=MODEL,
                http_port=0,
                scheduler=args.arm == "bandmaster",
                state_dir=Path(tempfile.mkdtemp(prefix="breakdown-live-")),
                log_level="WARNING",
                router_args=("--seed", str(args.seed)),
                extra_worker_args=("--log-level", "WARNING"),
            )
        )
        try:
            wait_for_workers(cluster.capacity.endpoint, 2)
            deadline = time.monotonic() + 60
            while not chat_ok(cluster.http_url, MODEL):
                if time.monotonic() > deadline:
                    raise RuntimeError("the router never routed a request within 60 s")
                time.sleep(0.2)
            runner = Runner(cluster.http_url + "/v1", MODEL, time_scale=args.speedup, seed=args.seed, arm=args.arm)
            summary = asyncio.run(runner.run(programs, len(programs))).summary()
        finally:
            cluster.stop()
    return summary, spans.report(args.speedup)


def _sim(args: argparse.Namespace, live_path: LivePathCosts | None) -> tuple[dict, dict]:
    policy = SERVICE_DEFAULT_PAUSE_POLICY
    scenario = SimScenario(
        arm=args.arm,
        workload="swe",
        programs=args.programs,
        max_turns=args.max_turns,
        seed=args.seed,
        workers=2,
        worker_kv_tokens=args.worker_kv_tokens,
        pause_policy=policy,
        control=live_control_params(args.speedup, policy),
        live_speedup=args.speedup,
        router_prompt="text",
    )
    result = Simulator(replace(scenario, live_path=live_path)).run()
    return result.summary(), breakdown_from_sim(result)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.programs < 1 or args.max_turns < 1 or args.speedup <= 0:
        print(
            "bench.breakdown_live: invalid configuration: programs >= 1, max_turns >= 1, speedup > 0", file=sys.stderr
        )
        return 2
    out = args.out_dir / args.arm
    programs = build_workload(
        "swe", args.programs, seed=args.seed, max_turns=args.max_turns, token_scale=1.0, tool_time_scale=1.0
    )
    try:
        live, live_breakdown = _live(args, programs, out)
        sim, sim_breakdown = _sim(args, None)
        sim_lp, sim_lp_breakdown = _sim(args, LivePathCosts())
    except ConfigError as exc:
        print(f"bench.breakdown_live: {exc}", file=sys.stderr)
        return 2
    report = {
        "arm": args.arm,
        "point": {k: getattr(args, k) for k in ("programs", "max_turns", "speedup", "worker_kv_tokens", "seed")},
        "live": {k: live.get(k) for k in KEYS},
        "sim": {k: sim.get(k) for k in KEYS},
        "sim_live_path": {k: sim_lp.get(k) for k in KEYS},
        "live_over_sim": round(live["steps_per_min"] / sim["steps_per_min"], 4),
        "live_over_sim_live_path": round(live["steps_per_min"] / sim_lp["steps_per_min"], 4),
        "breakdown": {"live": live_breakdown, "sim": sim_breakdown, "sim_live_path": sim_lp_breakdown},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    for name in ("live", "sim", "sim_live_path"):
        print(f"== {name}: {json.dumps(report[name])}")
        print(format_table(report["breakdown"][name]))
    print(
        f"live / sim steps/min {report['live_over_sim']}, with the live path model {report['live_over_sim_live_path']}"
    )
    return 0 if not live.get("turns_failed") else 1


if __name__ == "__main__":
    sys.exit(main())
