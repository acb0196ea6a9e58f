"""The offline simulator's own cost at fleet scale: CPU seconds per simulated hour, per arm.

    python -m bench.sim_scale --out bench/results/sim_scale.json        # make bench-sim
    python -m bench.sim_scale --smoke                                    # the make-test version
    python -m bench.sim_scale --fleet --out bench/results/sim_fleet.json # make bench-sim-fleet
    python -m bench.sim_scale --fleet --smoke                            # its make-test version

Scenario (the issue's "256+ programs on 8+ workers over an hour"): full-length SWE-agent programs
from the shipped traces, all 256 in flight at once, on 8 workers of 600K KV tokens each (about
2.3x the memory the programs' peak contexts need), GLM-4.5 FP8 on H200 timing. Each arm (Bandmaster,
KV routing, round-robin) runs in its own process (`--jobs`), and the report gives per arm the
CPU seconds, simulated minutes, speed (simulated seconds per CPU second), events and the
per-turn CPU cost, plus the work behind it (prompt tokens matched, tokens prefilled).

`--fleet` answers fleet-size questions instead: steady arrivals of SWE-agent programs drawn from
the trace's tuning split (uniform with replacement, seeded) through `factor` x the programs that
fit (the workers' pool over the split's mean peak context, as bench.evaluate counts it: 3x, as its
steady point), on 2, 8, 16 and 32 workers of 128K KV tokens, with the same programs per slot at
every size (1,000 programs at 32 workers). Per size and arm (Bandmaster, kv, oracle) it reports
the CPU seconds and the steady-state steps/min, and per size Bandmaster / kv / oracle: whether the
scheduler's gain over kv routing holds as replicas grow (target: within 10% of its gain at the
smallest size) and what Bandmaster costs in CPU over the kv arm.

It also checks, on a smaller scenario, that advancing pure-decode stretches as one event (the
default) gives the same run as one event per engine step, and how much cheaper it is.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from bench.machine import machine
from clients.workloads import scale as scale_programs
from clients.workloads import split_programs, trace_programs
from harness.simlib import SimScenario, simulate
from harness.simlib.scenario import ARMS
from services.common.settings.config import require

SCALE = dict(workload="swe", programs=256, workers=8, worker_kv_tokens=600_000, seed=0)
EQUIVALENCE = dict(workload="swe", programs=24, workers=2, worker_kv_tokens=200_000, max_turns=12, seed=1)
SMOKE_SCALE = dict(
    workload="swe", programs=16, workers=2, worker_kv_tokens=8_192, token_scale=0.05, max_turns=6, seed=0
)
SMOKE_EQUIVALENCE = dict(
    workload="swe", programs=6, workers=2, worker_kv_tokens=4_096, token_scale=0.1, max_turns=4, seed=1
)


# The targets (issue 24): CPU seconds per arm at the largest fleet point, and Bandmaster's gain
# over kv there against its gain at the smallest point, at the same oversubscription.
FLEET_CPU_S_PER_ARM = 300.0
FLEET_GAIN_TOLERANCE = 0.10
FLEET_ARMS = ("bandmaster", "kv", "oracle")


@dataclass(frozen=True)
class FleetSpec:
    """The fleet scenario's shape: one steady-arrivals point per worker count, at one oversubscription."""

    workers: tuple[int, ...] = (2, 8, 16, 32)
    programs_per_worker: float = 1_000 / 32
    """Programs played per worker (1,000 at 32 workers), so that every point, whichever sizes are
    run, has the same programs per slot."""
    worker_kv_tokens: int = 131_072
    factor: float = 3.0
    """Oversubscription: slots (programs in flight) = factor x the programs whose peak contexts fit."""
    fits_per_worker: float | None = None
    """Programs that fit one worker's pool; None = worker_kv_tokens / the split's mean peak context."""
    token_scale: float = 1.0
    max_turns: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        require(len(self.workers) >= 1 and min(self.workers) >= 1, "workers", self.workers, "workers >= 1")
        require(self.programs_per_worker > 0, "programs_per_worker", self.programs_per_worker, "> 0")
        require(self.factor > 0, "factor", self.factor, "factor > 0")

    def fits(self) -> float:
        """Programs that fit one worker (bench.evaluate's count: the pool over the mean peak context)."""
        if self.fits_per_worker is not None:
            return self.fits_per_worker
        programs = scale_programs(
            split_programs(trace_programs(), "tune"), token_scale=self.token_scale, max_turns=self.max_turns
        )
        return self.worker_kv_tokens / statistics.fmean(p.peak_context_tokens for p in programs)

    def point(self, workers: int, fits: float) -> dict:
        """The SimScenario fields of the point with `workers` workers."""
        programs = max(1, round(self.programs_per_worker * workers))
        parallel = max(1, round(self.factor * fits * workers))
        return dict(
            workload="swe",
            split="tune",
            draw="random",
            seed=self.seed,
            programs=programs,
            parallel=parallel if parallel < programs else 0,
            max_turns=self.max_turns,
            token_scale=self.token_scale,
            workers=workers,
            worker_kv_tokens=self.worker_kv_tokens,
            # Exact token pages, as bench.evaluate: cheaper than text chunks, the same comparisons.
            router_prompt="tokens",
        )


FLEET = FleetSpec()
# Tiny programs on tiny workers, 4 programs per slot: the fleet mode in seconds (the test suite's version).
SMOKE_FLEET = FleetSpec(
    workers=(2, 4),
    programs_per_worker=8,
    worker_kv_tokens=1_024,
    fits_per_worker=1.0,
    factor=2.0,
    token_scale=0.05,
    max_turns=3,
)


def run_fleet_arm(arm: str, scenario: dict) -> dict:
    """One arm of one fleet point -> its row (steady-state throughput and cost)."""
    result = simulate(SimScenario(arm=arm, **scenario))
    summary = result.summary()
    turns = summary["turns_ok"] + summary["turns_failed"]
    hours = result.run.wall_s / 3600
    return {
        "arm": arm,
        "workers": scenario["workers"],
        "completed": result.completed,
        "cpu_s": round(result.cpu_s, 2),
        "simulated_minutes": summary["simulated_minutes"],
        "cpu_s_per_simulated_hour": round(result.cpu_s / hours, 1) if hours else None,
        "cpu_ms_per_turn": round(1000 * result.cpu_s / turns, 2) if turns else None,
        "turns": turns,
        "steps_per_min": summary["steps_per_min"],
        "steady_steps_per_min": summary["steady_steps_per_min"],
        "steady_window_s": summary["steady_window_s"],
        "kv_hit_rate": summary["kv_hit_rate"],
        "recomputed_tokens": summary["worker_recomputed_tokens"],
        "pauses": result.scheduler_counters.get("pauses"),
        "held_admissions": result.scheduler_counters.get("held_admissions"),
        "hold_p50_s": result.scheduler_counters.get("hold_p50_s"),
    }


def _throughput(row: dict) -> float:
    """A point's figure: steps/min between warm-up and the last start, else over the makespan."""
    steady = row["steady_steps_per_min"]
    return steady if steady is not None else row["steps_per_min"]


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def fleet_points(rows: Sequence[dict]) -> list[dict]:
    """Per worker count: each arm's row, Bandmaster / kv / oracle, Bandmaster's CPU over kv's, and
    Bandmaster's gain over kv relative to the gain at the smallest worker count."""
    by_workers: dict[int, dict[str, dict]] = {}
    for row in rows:
        by_workers.setdefault(row["workers"], {})[row["arm"]] = row
    points = []
    base_gain = None
    for workers in sorted(by_workers):
        arms = {arm: by_workers[workers][arm] for arm in sorted(by_workers[workers], key=ARMS.index)}
        figure = {arm: _throughput(row) for arm, row in arms.items()}
        bm, kv, oracle = figure.get("bandmaster"), figure.get("kv"), figure.get("oracle")
        gain = _ratio(bm, kv)
        if base_gain is None:
            base_gain = gain
        points.append(
            {
                "workers": workers,
                "programs": None,
                "arms": arms,
                "bandmaster_over_kv": gain,
                "bandmaster_over_oracle": _ratio(bm, oracle),
                "kv_over_oracle": _ratio(kv, oracle),
                "gain_over_smallest": _ratio(gain, base_gain),
                "bandmaster_cpu_over_kv": _ratio(
                    arms.get("bandmaster", {}).get("cpu_s"), arms.get("kv", {}).get("cpu_s")
                ),
            }
        )
    return points


def fleet_verdicts(points: Sequence[dict]) -> dict:
    """PASS/MISS of the two fleet targets at the largest worker count (None when not measured)."""
    if not points:
        return {}
    largest = points[-1]
    cpu = [row["cpu_s"] for row in largest["arms"].values()]
    gain = largest["gain_over_smallest"]
    return {
        "cpu_s_per_arm_at_largest": max(cpu),
        "cpu_target": f"<= {FLEET_CPU_S_PER_ARM:g} CPU s per arm",
        "cpu": "PASS" if max(cpu) <= FLEET_CPU_S_PER_ARM else "MISS",
        "gain_over_smallest": gain,
        "gain_target": f"within {FLEET_GAIN_TOLERANCE:.0%} of the gain at the smallest size",
        "gain": None if gain is None else ("PASS" if abs(gain - 1) <= FLEET_GAIN_TOLERANCE else "MISS"),
    }


def run_fleet(spec: FleetSpec, arms: Sequence[str], jobs: int, on_progress=None) -> dict:
    """Every (size, arm) run, smallest sizes first; `on_progress(report)` after each finished run
    (the report of the runs so far), so that a long run that is stopped leaves its finished points."""
    fits = spec.fits()
    scenarios = {w: spec.point(w, fits) for w in spec.workers}
    work = [(arm, scenarios[w]) for w in sorted(spec.workers) for arm in arms]
    rows: list[dict] = []
    report: dict = {}
    with ProcessPoolExecutor(max_workers=min(jobs, len(work))) as pool:
        futures = [pool.submit(run_fleet_arm, arm, scenario) for arm, scenario in work]
        for future in as_completed(futures):
            rows.append(future.result())
            report = fleet_report(spec, fits, scenarios, rows, complete=len(rows) == len(work))
            if on_progress is not None:
                on_progress(report)
    return report


def fleet_report(spec: FleetSpec, fits: float, scenarios: dict, rows: Sequence[dict], complete: bool) -> dict:
    points = fleet_points(rows)
    for point in points:
        point["programs"] = scenarios[point["workers"]]["programs"]
        point["parallel"] = scenarios[point["workers"]]["parallel"] or point["programs"]
    return {
        "benchmark": "sim_fleet",
        "machine": machine(),
        "spec": {**asdict(spec), "fits_per_worker": round(fits, 3)},
        "complete": complete,
        "points": points,
        "targets": fleet_verdicts(points) if complete else {},
    }


def print_fleet(report: dict) -> None:
    for point in report["points"]:
        print(
            f"{point['workers']:>3} workers, {point['programs']} programs through {point['parallel']} slots: "
            f"bandmaster/kv {point['bandmaster_over_kv']}, bandmaster/oracle {point['bandmaster_over_oracle']}, "
            f"kv/oracle {point['kv_over_oracle']}, gain vs smallest {point['gain_over_smallest']}, "
            f"bandmaster CPU / kv CPU {point['bandmaster_cpu_over_kv']}"
        )
        for arm, row in point["arms"].items():
            print(
                f"    {arm:<12} {row['cpu_s']:>8.1f} CPU-s, {_throughput(row):>8.1f} steps/min, "
                f"{row['simulated_minutes']:>6.1f} simulated min, {row['cpu_s_per_simulated_hour']} CPU-s/simulated h"
            )
    targets = report["targets"]
    if targets:
        print(
            f"targets: CPU {targets['cpu']} ({targets['cpu_s_per_arm_at_largest']} s, {targets['cpu_target']}), "
            f"gain {targets['gain']} ({targets['gain_over_smallest']}, {targets['gain_target']})"
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
    parser.add_argument(
        "--fleet",
        action="store_true",
        help=f"the fleet scenario: steady arrivals on several worker counts (default arms {','.join(FLEET_ARMS)})",
    )
    parser.add_argument(
        "--fleet-workers", default=None, help="comma-separated worker counts of the fleet points (default 2,8,16,32)"
    )
    args = parser.parse_args(argv)
    if args.fleet and args.arms == parser.get_default("arms"):
        args.arms = ",".join(FLEET_ARMS)
    arms = [a for a in args.arms.split(",") if a]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown or not arms or args.jobs < 1:
        print(f"bench.sim_scale: --arms must name some of {', '.join(ARMS)} and --jobs >= 1", file=sys.stderr)
        return 2
    if args.fleet:
        spec = SMOKE_FLEET if args.smoke else FLEET
        if args.fleet_workers:
            try:
                counts = tuple(sorted({int(w) for w in args.fleet_workers.split(",") if w}))
                spec = FleetSpec(**{**asdict(spec), "workers": counts})
            except ValueError:
                print("bench.sim_scale: --fleet-workers must be positive integers", file=sys.stderr)
                return 2
        out = args.out

        def write(report: dict) -> None:
            if out:
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps(report, indent=1))

        report = run_fleet(spec, arms, args.jobs, write)
        print_fleet(report)
        return 0 if all(row["completed"] for p in report["points"] for row in p["arms"].values()) else 1
    scale = SMOKE_SCALE if args.smoke else SCALE
    with ProcessPoolExecutor(max_workers=min(args.jobs, len(arms))) as pool:
        rows = list(pool.map(run_arm, arms, [scale] * len(arms)))
    report = {
        "benchmark": "sim_scale",
        "machine": machine(),
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
