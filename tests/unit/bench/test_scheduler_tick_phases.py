"""The tick benchmark's split by part (bench.scheduler_bench.bench_tick_phases)."""

from __future__ import annotations

from bench.scheduler_bench import bench_tick, bench_tick_phases


def test_the_parts_of_the_tick_are_timed_and_the_mix_is_the_benchmarks():
    run = bench_tick_phases(300, 8, 4)
    parts = run["ms_per_tick"]
    for name in ("tick", "plan_resume", "plan_pauses", "plan_soft_demote", "apply resume", "apply pauses"):
        assert name in parts, name
    assert "apply other" not in parts  # every plan applied is one of the tick's planners'
    timed = sum(v for k, v in parts.items() if k != "tick" and not k.startswith("gc"))
    assert 0 < timed <= parts["tick"] * 1.01
    # The instrumentation changes nothing the tick decides: the same mix, the same transitions.
    assert run["activity"] == bench_tick(300, 8, 4)["activity"]
