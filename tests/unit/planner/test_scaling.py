"""Proposers (load, throughput, programs), the profile throughput model and the type-aware merge."""

import math

import pytest

from services.planner.adapters.profile import load_engine_profile
from services.planner.core.merge import merge
from services.planner.core.scaling import (
    LoadScalingConfig,
    ProgramScalingConfig,
    ProgramWindows,
    ThroughputScalingConfig,
    load_proposal,
    program_proposal,
    throughput_proposal,
)
from services.planner.core.throughput import EngineRate, engine_rps
from services.planner.core.types import Opinion, ProgramSignal, ReplicaLoad, Stage, TargetKind
from tests.unit.planner.helpers import NOW, inventory, obs, traffic


def loads(*usage, queued=0):
    return tuple(ReplicaLoad(f"w{i}", 1, queued, u) for i, u in enumerate(usage))


@pytest.mark.parametrize(
    "inv, ld, want",
    [
        (inventory(2), loads(0.95, 0.1), ("SET", 3, "scale_up")),
        (inventory(2), loads(0.1, 0.1, queued=4)[:2], ("SET", 3, "scale_up")),
        (inventory(2), loads(0.1, 0.2), ("SET", 1, "scale_down")),
        (inventory(1), loads(0.1), (None, None, "no_change")),
        (inventory(2), loads(0.5, 0.5), (None, None, "no_change")),
        (inventory(2, None, scaling=True), loads(0.95, 0.95), (None, None, "scaling_in_progress")),
        (inventory(3), loads(0.95, 0.95), (None, None, "worker_count_mismatch")),
        (inventory(2), None, (None, None, "no_load_data")),
    ],
)
def test_load_proposal(inv, ld, want):
    o = obs(inv=inv, loads=ld)
    op, reason = load_proposal(o, LoadScalingConfig(), inv.expected)
    assert reason == want[2]
    assert (op.kind.value if op else None, op.replicas if op else None) == want[:2]


def test_throughput_proposal_is_a_lower_bound_or_a_set():
    o = obs(traffic_=traffic(25.0))
    op, _ = throughput_proposal(o, ThroughputScalingConfig(enabled=True), EngineRate(10.0, 8, 40))
    assert (op.kind, op.replicas) == (TargetKind.AT_LEAST, 3)
    op, _ = throughput_proposal(o, ThroughputScalingConfig(enabled=True, as_lower_bound=False), EngineRate(10.0, 8, 40))
    assert (op.kind, op.replicas) == (TargetKind.SET, 3)
    assert (
        throughput_proposal(o, ThroughputScalingConfig(enabled=True), EngineRate(0.0, 0, math.inf))[1]
        == "model_not_ready"
    )


def sig(paused=0, longest=None, util=0.5, at=NOW):
    return ProgramSignal(at, paused, longest, util, 4)


def test_programs_paused_too_long_propose_scale_up():
    op, reason, _ = program_proposal(
        obs(inv=inventory(4), programs=sig(2, 31.0)), ProgramScalingConfig(), ProgramWindows(), 4
    )
    assert (op.replicas, reason) == (5, "programs_paused_too_long")
    op, reason, _ = program_proposal(
        obs(inv=inventory(4), programs=sig(2, 29.0)), ProgramScalingConfig(), ProgramWindows(), 4
    )
    assert op is None


def test_sustained_utilization_bands():
    cfg = ProgramScalingConfig(utilization_window_s=30)
    o = obs(inv=inventory(4), programs=sig(util=0.97))
    op, _, w = program_proposal(o, cfg, ProgramWindows(), 4)
    assert op is None and w.high_since_s == NOW
    o2 = obs(inv=inventory(4), programs=sig(util=0.97))
    object.__setattr__(o2, "now_s", NOW + 30)
    op, reason, w2 = program_proposal(o2, cfg, w, 4)
    assert (op.replicas, reason) == (5, "retention_pressure_sustained")
    # A dip below the band restarts the window.
    o3 = obs(inv=inventory(4), programs=sig(util=0.9))
    _, _, w3 = program_proposal(o3, cfg, w, 4)
    assert w3.high_since_s is None
    # Low utilisation for the window proposes -1 unless consolidation would cross the pause band.
    low = ProgramWindows(low_since_s=NOW - 30)
    op, reason, _ = program_proposal(obs(inv=inventory(4), programs=sig(util=0.3)), cfg, low, 4)
    assert (op.replicas, reason) == (3, "retention_slack_sustained")
    op, reason, _ = program_proposal(
        obs(inv=inventory(2), programs=sig(util=0.49)),
        ProgramScalingConfig(scale_up_utilization=0.9, scale_down_utilization=0.5),
        low,
        2,
    )
    assert op is None and reason == "scale_down_refused_consolidation"
    # Paused programs block a scale-down; unknown signal resets.
    op, _, _ = program_proposal(obs(inv=inventory(4), programs=sig(1, 5.0, util=0.3)), cfg, low, 4)
    assert op is None
    assert program_proposal(obs(inv=inventory(4)), cfg, low, 4)[2] == ProgramWindows()


def test_engine_rps_from_the_shipped_profiles():
    glm = load_engine_profile("glm45-fp8-h200")
    fast = engine_rps(glm, 2048, 256, 50.0)
    slow = engine_rps(glm, 2048, 256, 20.0)
    assert fast.rps > slow.rps > 0 and fast.itl_ms <= 50.0
    assert engine_rps(glm, 2048, 256, 1.0).rps == 0  # no batch meets a 1 ms ITL
    mocker = engine_rps(load_engine_profile("mocker-h100"), 512, 128, 60.0)
    assert mocker.rps > 0 and mocker.batch >= 1


def test_merge_stages_and_provenance():
    ops = [
        Opinion("load", Stage.PROPOSE, TargetKind.SET, 6, "up", priority=10),
        Opinion("programs", Stage.PROPOSE, TargetKind.SET, 7, "paused", priority=5),
        Opinion("throughput", Stage.PROPOSE, TargetKind.AT_LEAST, 8, "lb", priority=20),
        Opinion("floor", Stage.RECONCILE, TargetKind.AT_LEAST, 9, "batch"),
        Opinion("max", Stage.RECONCILE, TargetKind.AT_MOST, 12, "max"),
        Opinion("budget", Stage.CONSTRAIN, TargetKind.AT_MOST, 8, "gpu"),
        Opinion("sneaky", Stage.CONSTRAIN, TargetKind.SET, 20, "no sets here"),
    ]
    out = merge(ops, 5)
    assert out.replicas == 8 and out.action == "apply"
    assert out.stage_results == {"PROPOSE": 8, "RECONCILE": 9, "CONSTRAIN": 8}
    effects = [(s.source, s.effect) for s in out.steps]
    assert ("programs", "set") in effects and ("throughput", "raised_to_floor") in effects
    assert ("floor", "raised_to_floor") in effects and ("budget", "capped_to_ceiling") in effects
    assert ("sneaky", "set_dropped") in effects


def test_merge_floor_wins_a_conflict_within_a_stage_and_baseline_passes_through():
    out = merge(
        [
            Opinion("a", Stage.RECONCILE, TargetKind.AT_LEAST, 5, "f"),
            Opinion("b", Stage.RECONCILE, TargetKind.AT_MOST, 3, "c"),
        ],
        4,
    )
    assert out.replicas == 5
    assert merge([], 4).action == "skip_no_targets" and merge([], 4).replicas == 4
