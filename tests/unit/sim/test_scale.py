"""Scale runs of the simulator. They check completion and bookkeeping, never time.

The unmarked smoke is a small version of the benchmark-sized run (`-m slow`): 256 SWE-agent
programs on 8 workers, which docs/simulator.md reports CPU figures for.
"""

import pytest

from harness.simlib import SimScenario, Simulator


def _run(scenario: SimScenario):
    simulator = Simulator(scenario)
    result = simulator.run()
    summary = result.summary()
    assert result.completed, summary
    assert summary["programs_done"] == scenario.programs and summary["turns_failed"] == 0, summary
    if simulator.scheduler is not None:
        simulator.scheduler.ledger.check_invariants(simulator.now)
        assert simulator.scheduler.programs() == ()
    return result


@pytest.mark.parametrize("arm", ["bandmaster", "kv"])
def test_scale_smoke(arm):
    _run(
        SimScenario(
            arm=arm,
            workload="synthetic",
            programs=16,
            workers=4,
            worker_kv_tokens=65_536,
            max_turns=6,
            token_scale=0.5,
            router_prompt="tokens",
        )
    )


@pytest.mark.slow
@pytest.mark.parametrize("arm", ["bandmaster", "kv", "round_robin"])
def test_256_programs_on_8_workers(arm):
    result = _run(
        SimScenario(arm=arm, workload="swe", programs=256, workers=8, worker_kv_tokens=600_000, router_prompt="tokens")
    )
    print(arm, result.summary())
