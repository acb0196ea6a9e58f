"""The simulator's results, frozen: a fingerprint of each run's full report per arm and scenario.

The simulator's speed work must not change a single result. Each fingerprint is a hash of the
run's report (summary without the CPU figures, scheduler and worker counters, the timeline with
every control event, every turn and program row) and its per-turn phases, recorded from the code
before the speed work. A change that alters any simulated figure fails here; re-record only for
a deliberate change of the model (and say so in the commit).
"""

import hashlib
import json

import pytest

from harness.simlib import SimResult, SimScenario, simulate
from harness.simlib.scenario import ARMS

# The CPU figures are the only parts of a report that differ between two runs of one scenario.
COST_KEYS = ("sim_cpu_s", "sim_speed_x", "sim_programs_per_cpu_s")

SCENARIOS = {
    # Memory pressure: Bandmaster pauses, the kv arm recomputes.
    "pressure": dict(workload="swe", programs=8, workers=2, worker_kv_tokens=16_384, token_scale=0.5, max_turns=10),
    # Steady arrivals through 6 slots, a host tier, three workers, a random draw.
    "steady_host": dict(
        workload="swe",
        programs=12,
        parallel=6,
        workers=3,
        worker_kv_tokens=8_192,
        worker_host_kv_tokens=24_576,
        token_scale=0.25,
        max_turns=8,
        draw="random",
        seed=3,
    ),
    # The single-step reference (no decode runs), the exact token-page router prompts.
    "single_steps": dict(
        workload="swe",
        programs=6,
        workers=2,
        worker_kv_tokens=12_288,
        token_scale=0.25,
        max_turns=6,
        fuse_decode=False,
        router_prompt="tokens",
        seed=1,
    ),
}

EXPECTED = {
    ("pressure", "bandmaster"): "a66351aea79cce439a96",
    ("pressure", "kv"): "a7f462731557339a6e77",
    ("pressure", "round_robin"): "acfb1d86aa0248be984d",
    ("pressure", "oracle"): "1f9b8e40523107708561",
    ("pressure", "thunderagent"): "86eb2ba02a01a69380b8",
    ("pressure", "continuum"): "78ff54abdff03e3c5301",
    ("steady_host", "bandmaster"): "6b8451bc8430f50e0bd7",
    ("steady_host", "kv"): "485174849c3491cb5544",
    ("steady_host", "round_robin"): "2875b90798ff1fb5560b",
    ("steady_host", "oracle"): "d5390a5c0438568e2b20",
    ("steady_host", "thunderagent"): "55fa21c1fdd8e135964b",
    ("steady_host", "continuum"): "362604fc796da26ce8b8",
    ("single_steps", "bandmaster"): "9275d91b47fddaa7c81c",
    ("single_steps", "kv"): "d89c96bb4584ba7398e3",
    ("single_steps", "round_robin"): "124ec7e6c9822c174fe1",
    ("single_steps", "oracle"): "4f496d327b753fa60999",
    ("single_steps", "thunderagent"): "551d396f63494d0923ef",
    ("single_steps", "continuum"): "2a4913056e9084120d9f",
}


def fingerprint(result: SimResult) -> str:
    report = result.report()
    for key in COST_KEYS:
        report["summary"].pop(key)
    report["turn_phases"] = result.turn_phases
    return hashlib.sha256(json.dumps(report, sort_keys=True).encode()).hexdigest()[:20]


@pytest.mark.parametrize("name,arm", sorted(EXPECTED))
def test_results_are_unchanged(name, arm):
    result = simulate(SimScenario(arm=arm, **SCENARIOS[name]))
    assert result.completed
    assert fingerprint(result) == EXPECTED[(name, arm)]


def test_every_arm_and_scenario_is_pinned():
    assert set(EXPECTED) == {(name, arm) for name in SCENARIOS for arm in ARMS}
