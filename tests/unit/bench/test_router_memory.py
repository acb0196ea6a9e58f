"""bench/router_memory.py's pure parts: the conversations, the steady population, the figures, the targets;
and bench/rss.py's trend, which the scheduler's soak and this benchmark share."""

from __future__ import annotations

import random

import pytest

from bench import router_memory as rm
from bench.rss import rss_trend
from services.common.settings.errors import ConfigError


def test_a_conversation_is_the_system_prompt_then_the_latest_turns_each_answered_but_the_last():
    first = rm.conversation("program-7", 1, 40, window=3)
    assert [m["role"] for m in first] == ["system", "user"]
    assert first[1]["content"].startswith("program-7 step 1:") and len(first[1]["content"]) == 40
    third = rm.conversation("program-7", 3, 40, window=3)
    assert [m["role"] for m in third] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert third[:2] == first  # the same prefix: the router's session chain reuses it
    # Past the window it is compacted: the same size as the third turn's, its latest three turns.
    fifth = rm.conversation("program-7", 5, 40, window=3)
    assert len(fifth) == len(third) and fifth[1]["content"].startswith("program-7 step 3:")
    assert sum(len(m["content"]) for m in fifth) == sum(len(m["content"]) for m in third)


def test_programs_are_spread_over_the_clients():
    assert {rm.client_token(i, 4) for i in range(100)} == {f"Bearer router-memory-client-{i}" for i in range(4)}


def test_the_population_keeps_its_size_and_retires_its_oldest_first():
    population = rm.Population([f"program-{i}" for i in range(5)], 3, new_share=1.0, new_prefix="steady-")
    rng = random.Random(0)
    first = population.step(rng)
    assert first == rm.Step("steady-0", 1, 3, final="program-0") and first.turns == 3
    second = population.step(rng)
    assert second == rm.Step("steady-1", 1, 3, final="program-1")
    assert len(population) == 5 and population.retired == ["program-0", "program-1"]
    population.done(first)
    assert population.turns_done["steady-0"] == 3
    # Every open program is now either busy (steady-1) or open; churn never retires a busy one.
    for _ in range(3):
        population.step(rng)
    assert population.retired == ["program-0", "program-1", "program-2", "program-3", "program-4"]
    busy_oldest = population.step(rng)
    assert busy_oldest is not None and busy_oldest.final == "steady-0"  # the oldest not mid-turn


def test_a_returning_step_is_the_next_turn_of_an_open_program_not_mid_turn():
    programs = [f"program-{i}" for i in range(3)]
    population = rm.Population(programs, 2, new_share=0.0, new_prefix="steady-")
    rng = random.Random(1)
    steps = [population.step(rng) for _ in range(3)]
    assert sorted(s.program for s in steps) == programs  # three draws, three different programs
    assert all(s.first_turn == s.last_turn == 3 and s.final is None for s in steps)
    assert population.step(rng) is None  # all busy
    population.done(steps[0])
    again = population.step(rng)
    assert again == rm.Step(steps[0].program, 4, 4)


def test_the_population_draws_are_reproducible():
    def draws(seed: int) -> list:
        population = rm.Population([f"program-{i}" for i in range(50)], 3, 0.5, "steady-")
        rng = random.Random(seed)
        out = []
        for _ in range(40):
            step = population.step(rng)
            out.append(step)
            population.done(step)
        return out

    assert draws(3) == draws(3) != draws(4)


def test_rss_per_10k_programs_is_the_growth_scaled():
    assert rm.per_10k_kb(70_000, 76_000, 1_000) == 60_000
    assert rm.per_10k_kb(None, 76_000, 1_000) is None and rm.per_10k_kb(1, 2, 0) is None


def test_a_trend_is_judged_from_the_settle_point():
    climbing = [(float(t), 100_000 + 2 * t) for t in range(0, 100, 5)]  # 2 kB/s = 120 kB/min
    trend = rss_trend(climbing, 50.0)
    assert trend["rss_kb_slope_per_min"] == 120.0 and trend["samples_settled"] == 10
    assert trend["rss_kb_band_settled"] == [100_100, 100_190]
    assert trend["rss_kb_median_first_half"] < trend["rss_kb_median_second_half"]
    # None is late enough: every sample counts; fewer than three: no slope.
    assert rss_trend(climbing[:4], 500.0)["samples_settled"] == 4
    assert rss_trend(climbing[:2], 0.0)["rss_kb_slope_per_min"] is None


def _steady(
    router_slope_kb: float | None, scheduler_slope_kb: float | None, failed: int = 0, held: int = 10_000
) -> dict:
    def trend(slope):
        return {"rss_kb_slope_per_min": slope}

    return {
        "turns_failed": failed,
        "finals_failed": 0,
        "scheduler_programs_active": held,
        "trend": {"router": trend(router_slope_kb), "scheduler": trend(scheduler_slope_kb)},
    }


def test_flat_means_a_settled_slope_below_the_bound():
    load = {
        "turns_failed": 0,
        "router_kb_per_10k_programs": 65_000,
        "programs": 10_000,
        "scheduler_programs_active": 10_000,
    }
    rows = {t["name"]: t for t in rm.targets(load, _steady(-80.0, 200.0), judge_memory=True)}
    assert rows["router RSS flat over the steady run"]["status"] == "PASS"
    assert rows["scheduler RSS flat over the steady run"]["status"] == "PASS"
    assert rows["router RSS per 10,000 programs"]["value_mib"] == 63.5
    leaking = {t["name"]: t for t in rm.targets(load, _steady(600.0, None, failed=2), judge_memory=True)}
    assert leaking["router RSS flat over the steady run"]["status"] == "MISS"
    assert leaking["scheduler RSS flat over the steady run"]["status"] == "MISS"  # no slope: cannot pass
    assert leaking["turns and finals failed (load + steady)"]["value"] == 2
    assert leaking["turns and finals failed (load + steady)"]["status"] == "MISS"
    held = "programs open at the scheduler after the load, after the steady run"
    assert rows[held]["status"] == "PASS" and rows[held]["value"] == [10_000, 10_000]


def test_programs_the_scheduler_expired_fail_the_run():
    """Regression: `start_cluster` divides the scheduler's program idle TTL by the workers' speedup (0.9 s at
    1000x), so the first run's open programs expired at once and the routers dropped their state with them:
    the figures were not about open programs. The run now sets the TTL past its end and checks."""
    load = {"turns_failed": 0, "router_kb_per_10k_programs": 1, "programs": 10_000, "scheduler_programs_active": 10}
    rows = {t["name"]: t for t in rm.targets(load, _steady(0.0, 0.0, held=300), judge_memory=False)}
    held = rows["programs open at the scheduler after the load, after the steady run"]
    assert held["status"] == "MISS" and held["judged"] is True and held["value"] == [10, 300]
    assert not rm.passed({"services_exited": [], "targets": list(rows.values())})


def test_a_quick_run_judges_lost_turns_only():
    load = {"turns_failed": 0, "router_kb_per_10k_programs": 1, "programs": 10, "scheduler_programs_active": 10}
    steady = _steady(9_999.0, 9_999.0, held=10)
    report = {"services_exited": [], "targets": rm.targets(load, steady, judge_memory=False)}
    assert rm.passed(report)
    assert not rm.passed({**report, "services_exited": ["router"]})


@pytest.mark.parametrize(
    "field, value",
    [("programs", 0), ("programs", 2048 * 50 + 1), ("new_share", 1.5), ("settle_fraction", 1.0), ("sample_s", 200.0)],
)
def test_invalid_settings_name_the_field(field, value):
    with pytest.raises(ConfigError) as raised:
        rm.RouterMemoryConfig(**{field: value})
    assert raised.value.field == field
