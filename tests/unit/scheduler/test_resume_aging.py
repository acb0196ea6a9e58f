"""Resume aging: a large held program is not starved by shortest-first resume (ours, not the reference's)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.settings.errors import ConfigError
from services.scheduler.core import ControlParams, Lifecycle, ReplicaKey, Verdict
from tests.unit.scheduler.helpers import make_core, place_acting, rid

W = ReplicaKey("w", 0)


def _hold(core, sid: str, tokens: int, now: float) -> str:
    """Admit a new turn of `sid` that must wait (no room) and return its request id."""
    request_id = rid()
    result = core.admit(now, sid, "", tokens, request_id)
    assert result.decision.verdict is Verdict.WAIT
    return request_id


def test_a_large_program_waits_past_the_aging_time_then_makes_room():
    core = make_core({("w", 0): 10_000}, resume_aging_seconds=30.0)
    for i in range(8):
        place_acting(core, f"small-{i}", 1_000, ("w", 0))
    request_id = _hold(core, "big", 6_000, now=0.0)
    assert core.tick(10.0).resolutions == ()  # not aged yet: still held
    result = core.tick(31.0)
    decisions = [d for d in result.resolutions if d.request_id == request_id]
    assert decisions and decisions[0].replica == W
    assert core.program("big").lifecycle is Lifecycle.ACTIVE
    paused = [sid for sid in core.paused_ids() if sid.startswith("small-")]
    assert paused, "room was made by pausing ACTING programs"
    # Shortest first, and only as many as needed: what stays resident is below the pause threshold.
    stats = {s.replica: s for s in core.replica_stats(31.0)}
    assert stats[W].used_tokens < 10_000 * 0.95
    assert any("reason=aging" in log.message for log in result.logs)
    core.ledger.check_invariants(31.0)


def test_without_aging_the_reference_waits_for_the_forced_resume():
    core = make_core({("w", 0): 10_000}, resume_aging_seconds=0.0, resume_timeout_seconds=100.0)
    for i in range(8):
        place_acting(core, f"small-{i}", 1_000, ("w", 0))
    request_id = _hold(core, "big", 6_000, now=0.0)
    assert not [d for d in core.tick(60.0).resolutions if d.request_id == request_id]
    forced = [d for d in core.tick(101.0).resolutions if d.request_id == request_id]
    assert forced and forced[0].forced_resume


def test_an_oversized_program_is_resumed_where_it_can_use_the_most():
    core = make_core({("w", 0): 10_000, ("v", 0): 10_000}, resume_aging_seconds=5.0)
    place_acting(core, "a", 3_000, ("w", 0))
    place_acting(core, "b", 1_000, ("v", 0))
    request_id = _hold(core, "huge", 50_000, now=0.0)
    decisions = [d for d in core.tick(6.0).resolutions if d.request_id == request_id]
    assert decisions and decisions[0].replica == ReplicaKey("v", 0)
    core.ledger.check_invariants(6.0)


def test_aging_parameter_is_validated():
    with pytest.raises(ConfigError, match="resume_aging_seconds >= 0"):
        ControlParams(resume_aging_seconds=-1.0)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(100, 4_000), min_size=1, max_size=12), big=st.integers(500, 9_000))
def test_aging_never_leaves_a_resumed_program_paused_and_keeps_invariants(sizes, big):
    core = make_core({("w", 0): 10_000}, resume_aging_seconds=1.0)
    for i, size in enumerate(sizes):
        place_acting(core, f"p{i}", size, ("w", 0))
    request_id = rid()
    first = core.admit(0.0, "big", "", big, request_id)
    result = core.tick(2.0)
    core.ledger.check_invariants(2.0)
    if first.decision.verdict is Verdict.WAIT:
        assert [d for d in result.resolutions if d.request_id == request_id]
    assert core.program("big").lifecycle is Lifecycle.ACTIVE


def test_a_program_resumed_by_aging_is_not_paused_again_within_its_quantum():
    core = make_core({("w", 0): 10_000}, resume_aging_seconds=30.0)
    place_acting(core, "other", 5_000, ("w", 0))
    request_id = _hold(core, "big", 6_000, now=0.0)
    core.tick(31.0)  # aged: "other" yields, "big" resumes
    assert "other" in core.paused_ids() and core.program("big").lifecycle is Lifecycle.ACTIVE
    core.complete(32.0, "big", request_id, W, 9_800, 100)  # it grew past the pause threshold alone
    core.tick(40.0)  # within its quantum (15 s): not paused
    assert core.program("big").lifecycle is Lifecycle.ACTIVE
    core.tick(47.0)  # quantum over: the reference law applies
    assert core.program("big").lifecycle is Lifecycle.PAUSED
    core.ledger.check_invariants(47.0)
