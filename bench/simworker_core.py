"""Engine-core speed: simulated agent requests per CPU-second, in virtual time.

Runs a synthetic SWE-agent-like mix closed-loop through `SimEngine` (no server, no sleeps) and
reports how many LLM calls, prompt tokens and generated tokens the core simulates per CPU
second, and how much faster than real time it runs. The mix follows shared/traces/README.md
(medians / p90): turns per program 40 / 69, first prompt ~540 tokens, new prompt tokens per
turn 289 / 1,683, output tokens 126 / 977 (cap 2,560), tool time 0.67 / 1.02 s.

    python bench/simworker_core.py --out reports/simworker_core.json
    python bench/simworker_core.py --smoke
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.replay import Program, Turn, median, replay_closed_loop  # noqa: E402
from services.simworker.core.api import EngineConfig  # noqa: E402
from services.simworker.core.engine import SimEngine  # noqa: E402
from services.simworker.profiles import load_profile  # noqa: E402


def _lognormal(rng: random.Random, median_value: float, p90: float) -> float:
    sigma = math.log(p90 / median_value) / 1.2816
    return rng.lognormvariate(math.log(median_value), sigma)


def agent_mix(programs: int, seed: int, max_turns: int | None = None) -> list[Program]:
    rng = random.Random(seed)
    out = []
    for p in range(programs):
        n_turns = min(140, max(5, round(_lognormal(rng, 40, 69))))
        if max_turns:
            n_turns = min(n_turns, max_turns)
        size = round(_lognormal(rng, 540, 900))
        turns = []
        for _ in range(n_turns):
            output = min(2560, max(1, round(_lognormal(rng, 126, 977))))
            turns.append(Turn(size, output, min(30.0, _lognormal(rng, 0.667, 1.022))))
            size = min(120_000, size + output + round(_lognormal(rng, 289, 1683)))
        out.append(Program(f"p{p}", tuple(turns), env_prepare_s=rng.uniform(0, 8)))
    return out


SCENARIOS = {
    # name: (concurrency, programs, pool tokens, hicache)
    "c32_roomy": (32, 64, 4_000_000, False),
    "c64_tight_hicache": (64, 96, 600_000, True),
}


def run_scenario(
    name: str, concurrency: int, programs: int, pool_tokens: int, hicache: bool, seed: int, max_turns: int | None
) -> dict:
    config = EngineConfig(
        max_total_tokens=pool_tokens,
        page_size=16,
        context_length=262_144,
        max_running_requests=256,
        chunked_prefill_size=8192,
        enable_hierarchical_cache=hicache,
        hicache_ratio=2.0,
        seed=seed,
    )
    engine = SimEngine(config, load_profile("glm45-fp8-h200"))
    mix = agent_mix(programs, seed, max_turns)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    records = replay_closed_loop(engine, mix, concurrency, seed=seed)
    cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    stats = engine.stats()
    virtual_s = max(r.last_token_s for r in records)
    return {
        "scenario": name,
        "concurrency": concurrency,
        "programs": programs,
        "kv_pool_tokens": pool_tokens,
        "hicache": hicache,
        "calls": len(records),
        "prompt_tokens": stats.prompt_tokens_total,
        "generated_tokens": stats.generation_tokens_total,
        "cpu_s": round(cpu_s, 3),
        "wall_s": round(wall_s, 3),
        "virtual_s": round(virtual_s, 1),
        "requests_per_cpu_s": round(len(records) / cpu_s, 1),
        "generated_tokens_per_cpu_s": round(stats.generation_tokens_total / cpu_s),
        "prompt_tokens_per_cpu_s": round(stats.prompt_tokens_total / cpu_s),
        "virtual_over_cpu": round(virtual_s / cpu_s, 1),
        "cache_hit_rate": round(stats.cached_tokens_total / max(1, stats.prompt_tokens_total), 4),
        "recomputed_tokens": stats.recomputed_tokens_total,
        "retractions": stats.retractions_total,
        "host_loadback_tokens": stats.host_loadback_tokens_total,
        "median_ttft_ms": round(median(r.ttft_s for r in records) * 1000, 1),
        "median_itl_ms": round(median(r.itl_s for r in records if r.output_tokens >= 20) * 1000, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="write the JSON report here")
    parser.add_argument("--smoke", action="store_true", help="tiny run (seconds) to check the bench works")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    results = []
    for name, (concurrency, programs, pool, hicache) in SCENARIOS.items():
        if args.smoke:
            concurrency, programs, max_turns = min(concurrency, 8), 8, 6
            pool = min(pool, 100_000)
        else:
            max_turns = None
        results.append(run_scenario(name, concurrency, programs, pool, hicache, args.seed, max_turns))
        print(json.dumps(results[-1]), flush=True)
    report = {
        "bench": "simworker_core",
        "profile": "glm45-fp8-h200",
        "smoke": args.smoke,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "results": results,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
