"""The offline simulator's own cost at fleet scale: CPU seconds per simulated hour, per arm.

    python -m bench.sim_scale --out bench/results/sim_scale.json        # make bench-sim
    python -m bench.sim_scale --smoke                                    # the make-test version

Scenario (the issue's "256+ programs on 8+ workers over an hour"): full-length SWE-agent programs
from the shipped traces, all 256 in flight at once, on 8 workers of 600K KV tokens each (about
2.3x the memory the programs' peak contexts need), GLM-4.5 FP8 on H200 timing. Each arm (Bandmaster,
KV routing, round-robin) runs in its own process (`--jobs`), and the report gives per arm the
CPU seconds, simulated minutes, speed (simulated seconds per CPU second), events and the
per-turn CPU cost, plus the work behind it (prompt tokens matched, tokens prefilled).

It also checks, on a smaller scenario, that advancing pure-decode stretches as one event (the
default) gives the same run as one event per engine step, and how much cheaper it is.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Sequence

from harness.simlib import SimScenario, simulate
from harness.simlib.scenario import ARMS

SCALE = dict(workload="swe", programs=256, workers=8, worker_kv_tokens=600_000, seed=0)
EQUIVALENCE = dict(workload="swe", programs=24, workers=2, worker_kv_tokens=200_000, max_turns=12, seed=1)
SMOKE_SCALE = dict(
    workload="swe", programs=16, workers=2, worker_kv_tokens=8_192, token_scale=0.05, max_turns=6, seed=0
)
SMOKE_EQUIVALENCE = dict(
    workload="swe", programs=6, workers=2, worker_kv_tokens=4_096, token_scale=0.1, max_turns=4, seed=1
)


def run_arm(arm: str, scenario: dict) -> dict:
    """One arm of the scale scenario -> its cost row."""
    result = simulate(SimScenario(arm=arm, **scenario))
    summary = result.summary()
    prefilled = summary["worker_prompt_tokens"] - summary["worker_cached_tokens"]
    turns = summary["turns_ok"] + summary["turns_failed"]
    return {
        "arm": arm,
        "completed": result.completed,
        "cpu_s": round(result.cpu_s, 2),
        "simulated_minutes": summary["simulated_minutes"],
        "speed_x": summary["sim_speed_x"],
        "cpu_s_per_simulated_hour": round(result.cpu_s / (result.run.wall_s / 3600), 1) if result.run.wall_s else None,
        "events": result.events,
        "turns": turns,
        "cpu_ms_per_turn": round(1000 * result.cpu_s / turns, 2) if turns else None,
        "prompt_tokens": summary["worker_prompt_tokens"],
        "prefilled_tokens": prefilled,
        "generated_tokens": summary["worker_generation_tokens"],
        "steps_per_min": summary["steps_per_min"],
        "kv_hit_rate": summary["kv_hit_rate"],
    }


def decode_run_check(scenario: dict) -> dict:
    """Decode runs on vs off on one scenario: equal results, and the cost of each."""
    rows = {}
    results = {}
    for fused in (True, False):
        result = simulate(SimScenario(arm="bandmaster", fuse_decode=fused, **scenario))
        results[fused] = result
        rows["decode_runs" if fused else "single_steps"] = {"cpu_s": round(result.cpu_s, 3), "events": result.events}
    a, b = results[True].report(), results[False].report()
    same = all(a[key] == b[key] for key in ("turns", "workers", "scheduler", "timeline"))
    cost = rows["single_steps"]["cpu_s"] / rows["decode_runs"]["cpu_s"] if rows["decode_runs"]["cpu_s"] else None
    return {
        "scenario": scenario,
        **rows,
        "identical_results": same,
        "single_step_cpu_over_decode_runs": round(cost, 2) if cost else None,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sim_scale", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    # The oracle is a reference for ratios, not a routing arm whose cost this measures.
    parser.add_argument(
        "--arms",
        default=",".join(a for a in ARMS if a != "oracle"),
        help=f"comma-separated arms from {', '.join(ARMS)} (default: all but oracle)",
    )
    parser.add_argument("--jobs", type=int, default=2, help="arms simulated in parallel processes")
    parser.add_argument("--smoke", action="store_true", help="a tiny scenario (the make-test version)")
    args = parser.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown or not arms or args.jobs < 1:
        print(f"bench.sim_scale: --arms must name some of {', '.join(ARMS)} and --jobs >= 1", file=sys.stderr)
        return 2
    scale = SMOKE_SCALE if args.smoke else SCALE
    with ProcessPoolExecutor(max_workers=min(args.jobs, len(arms))) as pool:
        rows = list(pool.map(run_arm, arms, [scale] * len(arms)))
    report = {
        "benchmark": "sim_scale",
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "scenario": {
            **scale,
            "smoke": args.smoke,
            "fuse_decode": SimScenario.fuse_decode,
            "timing_profile": SimScenario.worker_timing_profile,
        },
        "arms": rows,
        "decode_runs": decode_run_check(SMOKE_EQUIVALENCE if args.smoke else EQUIVALENCE),
    }
    for row in rows:
        print(
            f"{row['arm']:<12} {row['cpu_s']:>8.1f} CPU-s for {row['simulated_minutes']:>6.1f} simulated min "
            f"({row['speed_x']}x real time, {row['cpu_ms_per_turn']} ms/turn, {row['events']} events)"
        )
    check = report["decode_runs"]
    print(
        f"decode runs: identical={check['identical_results']}, "
        f"single steps cost {check['single_step_cpu_over_decode_runs']}x"
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
    ok = all(r["completed"] for r in rows) and check["identical_results"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
