"""The offline simulator: configuration, capacity, the request path per arm, determinism, records, CLI."""

import dataclasses
import json

import pytest

from bench import sim
from clients.player import RunResult
from harness.simlib import SimScenario, Simulator, live_control_params, simulate
from harness.simlib.scenario import replica_capacity, server_info, worker_id
from services.capacity.core.cards import RetentionSettings, derive_card, replicas_for
from services.common.settings.errors import ConfigError
from services.scheduler.core.defaults import SERVICE_DEFAULT_PAUSE_POLICY, service_control_params
from services.simworker.core.build import host_total_tokens

SMALL = dict(workload="swe", programs=4, max_turns=4, token_scale=0.25, workers=2, worker_kv_tokens=16_384)
# Enough pressure that the reference (threshold) policy pauses and resumes (checked below).
PRESSURE = dict(
    workload="swe",
    programs=8,
    max_turns=8,
    token_scale=0.5,
    workers=2,
    worker_kv_tokens=16_384,
    pause_policy="threshold",
)


@pytest.mark.parametrize(
    "field,value,rule",
    [
        ("arm", "random", "arm in"),
        ("workload", "chat", "workload in"),
        ("programs", 0, "programs >= 1"),
        ("workers", 0, "1 <= workers"),
        ("worker_host_kv_tokens", 1000, "worker_host_kv_tokens > worker_kv_tokens"),
        ("worker_page_size", 1, "worker_page_size >= 2"),
        ("router_prompt", "json", "router_prompt in"),
        ("live_speedup", 0.0, "live_speedup > 0"),
        ("request_overhead_s", -1.0, "request_overhead_s >= 0"),
        ("pause_policy", "nope", "pause_policy in"),
        ("token_scale", 0.0, "token_scale > 0"),
    ],
)
def test_invalid_scenarios_name_the_rule(field, value, rule):
    with pytest.raises(ConfigError) as info:
        SimScenario(**{field: value})
    assert info.value.field == field and rule in info.value.reason


def test_worker_rules_surface_at_construction():
    with pytest.raises(ConfigError, match="chunked_prefill_size"):
        SimScenario(worker_chunked_prefill_size=8)


@pytest.mark.parametrize("gpu,host", [(16_384, 0), (65_536, 0), (16_384, 40_000), (65_536, 262_144)])
def test_retention_budget_is_what_the_capacity_service_derives(gpu, host):
    scenario = SimScenario(worker_kv_tokens=gpu, worker_host_kv_tokens=host)
    engine, profile, capacity = scenario.build_worker(0)
    config = scenario.engine_config(0)
    # GPU KV + the host pool the engine really has (write_back: counted in full).
    expected = gpu + (host_total_tokens(config) if host else 0)
    assert capacity.retention_tokens == expected
    assert capacity.max_programs == scenario.worker_max_running_requests
    # The engine holds whole pages of the host pool the worker reports (and capacity counts).
    assert 0 <= (expected - gpu) - engine.stats().host_total_tokens < scenario.worker_page_size
    (view,) = replicas_for(worker_id(0), derive_card(server_info(config, profile)), RetentionSettings())
    assert replica_capacity(worker_id(0), config, profile).retention_tokens == view.retention_tokens
    if host:
        assert abs(capacity.retention_tokens - (gpu + host)) <= gpu * 1e-6 + scenario.worker_page_size


def test_live_control_params_follow_bandmaster_up():
    assert live_control_params(1.0) == service_control_params()
    assert live_control_params(1.0, "threshold") == service_control_params("threshold")
    assert live_control_params(1.0, "threshold").pause_threshold == 0.95
    assert live_control_params(1.0).resume_aging_seconds == 300.0
    assert live_control_params(20.0).scheduler_interval_seconds == pytest.approx(5.0)
    # `bandmaster up` floors the wall interval at 50 ms: at 400x that is 20 simulated seconds.
    assert live_control_params(400.0).scheduler_interval_seconds == pytest.approx(20.0)
    assert live_control_params(4.0, pause_threshold=0.9).pause_threshold == 0.9


def _essential(result) -> dict:
    summary = {k: v for k, v in result.summary().items() if not k.startswith("sim_")}
    return {
        "summary": summary,
        "timeline": result.timeline,
        "workers": result.worker_counters,
        "scheduler": result.scheduler_counters,
        "turns": result.run.turns,
    }


@pytest.mark.parametrize("arm", ["bandmaster", "kv", "round_robin"])
def test_every_arm_completes_with_the_live_summary_keys(arm):
    result = simulate(SimScenario(arm=arm, **SMALL))
    summary = result.summary()
    live_keys = set(RunResult("x", 1, 1.0, 1.0).summary())
    assert live_keys <= set(summary)
    assert summary["programs_done"] == 4 and summary["turns_failed"] == 0
    assert summary["turns_ok"] == 16 and result.completed
    for key in (
        "worker_recomputed_tokens",
        "worker_retractions",
        "worker_preemptions",
        "worker_host_loadback_tokens",
        "worker_prompt_tokens",
        "worker_cached_tokens",
    ):
        assert key in summary
    assert summary["worker_requests"] == 16
    # Simulated minutes come from the makespan: the last program's end.
    assert summary["wall_s"] == pytest.approx(max(p.duration_s for p in result.run.programs), abs=1e-3)


def test_deterministic_for_a_scenario():
    scenario = SimScenario(arm="bandmaster", **PRESSURE)
    assert _essential(simulate(scenario)) == _essential(simulate(scenario))


@pytest.mark.parametrize("arm", ["bandmaster", "kv"])
def test_decode_runs_change_nothing_but_the_cost(arm):
    """One event per pure-decode run (the default) vs one per engine step: the same run."""
    fused = simulate(SimScenario(arm=arm, **PRESSURE))
    stepped = simulate(SimScenario(arm=arm, fuse_decode=False, **PRESSURE))
    assert _essential(fused) == _essential(stepped)
    assert fused.report()["turns"] == stepped.report()["turns"]
    assert fused.worker_counters == stepped.worker_counters
    assert fused.events < stepped.events / 2


def test_round_robin_alternates_workers():
    result = simulate(SimScenario(arm="round_robin", **SMALL))
    requests = [c["requests"] for c in result.worker_counters.values()]
    assert requests == [8, 8]


def test_kv_arm_keeps_a_program_on_its_cache():
    kv = simulate(SimScenario(arm="kv", **SMALL)).summary()
    rr = simulate(SimScenario(arm="round_robin", **SMALL)).summary()
    assert kv["kv_hit_rate"] > rr["kv_hit_rate"]


def test_bandmaster_pauses_resumes_and_releases_everything():
    simulator = Simulator(SimScenario(arm="bandmaster", **PRESSURE))
    result = simulator.run()
    counters = result.scheduler_counters
    assert counters["pauses"] > 0 and counters["resumes"] > 0
    assert counters["held_admissions"] > 0
    assert counters["released"] == 8 and counters["admissions"] == 64
    assert result.summary()["turns_ok"] == 64
    core = simulator.scheduler
    assert core.programs() == () and core.waiting_request_ids() == ()
    core.ledger.check_invariants(simulator.now)
    assert not simulator._held and not simulator._in_flight
    assert simulator.router is not None and len(simulator.router.load) == 0


def test_timeline_samples_every_worker_at_each_tick():
    result = simulate(SimScenario(arm="bandmaster", **PRESSURE))
    timeline = result.timeline
    interval = timeline["interval_s"]
    assert timeline["bands"]["pause_threshold"] == 0.95 and timeline["bands"]["resume_ceiling"] == pytest.approx(0.85)
    columns = timeline["columns"]
    for wid, rows in timeline["workers"].items():
        assert wid in timeline["retention_tokens"]
        assert len(rows) == int(result.run.wall_s // interval) or len(rows) == int(result.run.wall_s // interval) + 1
        assert all(len(row) == len(columns) for row in rows)
        assert [row[0] for row in rows] == pytest.approx([interval * (i + 1) for i in range(len(rows))])
        assert all(0.0 <= row[columns.index("engine_token_usage")] <= 1.0 for row in rows)
    pauses = sum(row[columns.index("pauses")] for rows in timeline["workers"].values() for row in rows)
    assert pauses == result.scheduler_counters["pauses"]
    kinds = {e[1] for e in timeline["control_events"]}
    assert {"pause", "resume"} <= kinds


def test_kv_arm_timeline_has_engine_columns_only():
    timeline = simulate(SimScenario(arm="kv", **SMALL)).timeline
    columns = timeline["columns"]
    for rows in timeline["workers"].values():
        assert rows and all(row[columns.index("utilisation")] is None for row in rows)
        assert all(row[columns.index("engine_running")] >= 0 for row in rows)


def test_token_prompts_route_like_text_prompts_on_a_small_scenario():
    text = simulate(SimScenario(arm="kv", **SMALL)).summary()
    tokens = simulate(SimScenario(arm="kv", router_prompt="tokens", **SMALL)).summary()
    assert tokens["turns_ok"] == text["turns_ok"]
    assert tokens["steps_per_min"] == pytest.approx(text["steps_per_min"], rel=0.10)


def test_request_overhead_and_frontend_latency_lengthen_ttft():
    base = SimScenario(arm="kv", **SMALL)
    plain = simulate(dataclasses.replace(base, frontend_latency=False)).summary()
    fronted = simulate(base).summary()
    slow = simulate(dataclasses.replace(base, request_overhead_s=0.5)).summary()
    assert plain["ttft_p50_s"] < fronted["ttft_p50_s"] < slow["ttft_p50_s"]


def test_parallel_limits_programs_in_flight():
    result = simulate(SimScenario(arm="kv", parallel=1, **SMALL))
    programs = result.run.programs
    assert len(programs) == 4 and all(p.finished for p in programs)
    # One slot: the makespan is the sum of the program times.
    assert result.run.wall_s == pytest.approx(sum(p.duration_s for p in programs), rel=1e-6)


def test_cli_prints_the_summary_and_writes_the_report(tmp_path, capsys):
    out = tmp_path / "report.json"
    code = sim.main(
        [
            "--arm",
            "bandmaster",
            "--workload",
            "short",
            "--programs",
            "3",
            "--max-turns",
            "3",
            "--workers",
            "2",
            "--worker-kv-tokens",
            "16384",
            "--pause-threshold",
            "0.9",
            "--scheduler-interval-seconds",
            "2",
            "--seed",
            "3",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    report = json.loads(out.read_text())
    assert printed == report["summary"] and printed["turns_ok"] == 9
    assert report["timeline"]["bands"]["pause_threshold"] == 0.9
    assert report["timeline"]["interval_s"] == 2.0
    assert {"summary", "scheduler", "workers", "timeline", "turns", "programs"} <= set(report)


def test_cli_refuses_invalid_scheduler_flags(capsys):
    assert sim.main(["--pause-threshold", "0.5", "--pause-target", "0.9"]) == 2
    assert "pause_target" in capsys.readouterr().err
    assert sim.main(["--no-such-flag", "1"]) == 2


def test_a_prompt_the_worker_cannot_hold_fails_the_turn_and_ends_the_program():
    # 4K-token pools cannot hold the trace's first prompts (several thousand tokens at scale 1).
    for arm in ("bandmaster", "kv"):
        simulator = Simulator(
            SimScenario(arm=arm, workload="swe", programs=2, max_turns=3, workers=1, worker_kv_tokens=2_048)
        )
        result = simulator.run()
        summary = result.summary()
        assert summary["turns_failed"] >= 1 and summary["programs_done"] < 2 and result.completed
        failed = [t for t in result.run.turns if not t.ok]
        assert all("does not fit" in t.error for t in failed)
        if simulator.scheduler is not None:
            assert simulator.scheduler.programs() == ()
        assert len(simulator.router.load) == 0


def test_default_policy_is_the_services_and_its_flags_reach_it():
    from services.scheduler.core.policies import CostAwarePauseParams

    assert SimScenario().pause_policy == SERVICE_DEFAULT_PAUSE_POLICY
    scenario, _ = sim.scenario_from_args(
        ["--pause-policy", "cost_aware", "--cost-aware-tool-seconds", "7", "--router-temperature", "0.5"]
    )
    assert scenario.cost_aware == CostAwarePauseParams(tool_seconds=7.0)
    assert scenario.router_params().router_temperature == 0.5
    assert scenario.make_pause_policy().name == "cost_aware"
    threshold, _ = sim.scenario_from_args(["--pause-policy", "threshold"])
    assert threshold.make_pause_policy().name == "threshold"


@pytest.mark.parametrize("policy", ["threshold", "cost_aware"])
def test_both_policies_complete_under_pressure(policy):
    simulator = Simulator(SimScenario(arm="bandmaster", **{**PRESSURE, "pause_policy": policy}))
    result = simulator.run()
    assert result.completed and result.summary()["turns_ok"] == 64
    simulator.scheduler.ledger.check_invariants(simulator.now)
