"""The tick benchmark's split by part (bench.scheduler_bench.bench_tick_phases)."""

from __future__ import annotations

import pytest

from bench.scheduler_bench import bench_tick, bench_tick_phases_pure, tick_core
from services.scheduler.core.defaults import SERVICE_DEFAULT_PAUSE_POLICY, service_control_params
from services.scheduler.core.policies import CostAwarePauseParams


@pytest.mark.parametrize("policy", ["cost_aware", "threshold"])
def test_the_parts_of_the_tick_are_timed_and_the_mix_is_the_benchmarks(policy: str):
    """On the pure core (in a process of its own when the compiled one is loaded here): the parts are
    timed by replacing the core's methods."""
    run = bench_tick_phases_pure(300, 8, 4, policy)
    assert run["scheduler_core"] == "pure Python"
    assert run["pause_policy"] == policy
    parts = run["ms_per_tick"]
    for name in ("tick", "plan_resume", "plan_pauses", "soft_demote", "apply resume", "apply pauses"):
        assert name in parts, name
    assert "apply other" not in parts  # every plan applied is one of the tick's planners'
    timed = sum(v for k, v in parts.items() if k != "tick" and not k.startswith("gc"))
    assert 0 < timed <= parts["tick"] * 1.01
    # The instrumentation changes nothing the tick decides: the same mix, the same transitions (and
    # the core loaded here, compiled or not, decides alike).
    assert run["activity"] == bench_tick(300, 8, 4, pause_policy=policy)["activity"]


def test_the_cost_aware_tick_core_is_the_services():
    """The benchmark times the core the service builds with no flags, at its own 5 s interval."""
    core = tick_core("cost_aware")
    assert core.policy.name == SERVICE_DEFAULT_PAUSE_POLICY
    assert core.params == service_control_params(SERVICE_DEFAULT_PAUSE_POLICY, scheduler_interval_seconds=5.0)
    assert core.policy.params == CostAwarePauseParams()  # type: ignore[attr-defined]
    reference = tick_core("threshold")
    assert reference.policy.name == "threshold" and reference.params.acting_decay_tau_seconds == 30.0
    with pytest.raises(ValueError):
        tick_core("nope")


def test_the_tick_report_has_cpu_time_per_tick_and_a_digest_of_its_decisions():
    """Beside the wall time: each tick's thread CPU time, its pauses / resumes / marks, and a digest
    of every tick's events, logs and resolutions, equal for two runs of the same mix (and different
    for another mix)."""
    run = bench_tick(300, 8, 4, pause_policy="cost_aware")
    assert run["tick_cpu_ms"]["p50"] > 0 and run["tick_cpu_ms"]["max"] >= run["tick_cpu_ms"]["p99"]
    per_tick = run["pauses_resumes_marks_per_tick"]
    assert len(per_tick) == 4
    assert [sum(t[i] for t in per_tick) for i in range(3)] == [
        run["activity"]["paused"],
        run["activity"]["resumed"],
        run["activity"]["marked"],
    ]
    assert len(run["decisions_sha256"]) == 64
    assert bench_tick(300, 8, 4, pause_policy="cost_aware")["decisions_sha256"] == run["decisions_sha256"]
    assert bench_tick(300, 8, 4, seed=8, pause_policy="cost_aware")["decisions_sha256"] != run["decisions_sha256"]


def test_the_tick_only_run_writes_its_json_report(tmp_path, capsys):
    """Regression: `--tick-only` printed its report and ignored `--out`."""
    import json

    from bench.scheduler_bench import main

    out = tmp_path / "tick.json"
    argv = ["--tick-only", "--smoke", "--pause-policy", "cost_aware", "--scaling-programs", "200", "--out", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["tick"] and report["tick_scaling"]
    assert report["tick_runs"][0]["pause_policy"] == "cost_aware" and report["machine"]["cpus"]
    assert f"wrote {out}" in capsys.readouterr().out
