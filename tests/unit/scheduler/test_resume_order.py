"""Resume order: the program-aware law resumes the paused queue first come, first served (a program
that does not fit is skipped); the reference resumes the smallest first."""

from __future__ import annotations

from services.scheduler.core import Lifecycle, ReplicaKey, Verdict
from tests.unit.scheduler.helpers import make_core, place_acting, rid

W = ("w", 0)


def _hold(core, sid: str, tokens: int, now: float) -> str:
    request_id = rid()
    assert core.admit(now, sid, "", tokens, request_id).decision.verdict is Verdict.WAIT
    return request_id


def _queue_big_then_small(**params):
    """A full 10K replica; `big` (4K) then `small` (2K) queue behind it; then room for one frees up
    (the reference's resume ceiling is 85%: 8.5K - 4K - 100 of buffer)."""
    core = make_core({W: 10_000}, resume_aging_seconds=0.0, acting_decay_tau_seconds=1e6, **params)
    place_acting(core, "resident", 9_000, W)
    _hold(core, "big", 4_000, now=1.0)
    _hold(core, "small", 2_000, now=2.0)
    core.release(3.0, "resident")
    place_acting(core, "stays", 4_000, W)  # resume room 8.5K - 4.1K: one of them only
    core.tick(4.0)
    core.check_invariants(4.0)
    return core


def test_the_reference_resumes_the_smallest_first():
    core = _queue_big_then_small()
    assert core.program("small").lifecycle is Lifecycle.ACTIVE
    assert core.program("big").lifecycle is Lifecycle.PAUSED


def test_pause_order_resumes_the_first_paused_first():
    core = _queue_big_then_small(resume_in_pause_order=True)
    assert core.program("big").lifecycle is Lifecycle.ACTIVE
    assert core.program("small").lifecycle is Lifecycle.PAUSED


def test_pause_order_skips_a_head_that_does_not_fit():
    core = make_core({W: 10_000}, resume_aging_seconds=0.0, acting_decay_tau_seconds=1e6, resume_in_pause_order=True)
    place_acting(core, "resident", 9_000, W)
    _hold(core, "huge", 8_000, now=1.0)
    _hold(core, "small", 2_000, now=2.0)
    core.release(3.0, "resident")
    place_acting(core, "stays", 4_000, W)
    core.tick(4.0)
    assert core.program("small").lifecycle is Lifecycle.ACTIVE, "the room is not left idle behind the head"
    assert core.program("huge").lifecycle is Lifecycle.PAUSED
    core.check_invariants(4.0)


def test_groups_still_come_first():
    # A paused ACTING program (group 2) paused before a waiting turn (group 0) still resumes after it.
    core = make_core({W: 10_000}, resume_aging_seconds=0.0, acting_decay_tau_seconds=1e6, resume_in_pause_order=True)
    place_acting(core, "idle", 2_500, W)
    core._pause(0.0, core._programs["idle"], "test", _acc())
    place_acting(core, "resident", 9_000, W)
    rid_big = rid()
    core.admit(1.0, "w0", "", 1_000, rid_big)  # a live program's turn: places, then completes
    core.complete(1.0, "w0", rid_big, ReplicaKey(*W), 1_000, 0)
    core._pause(1.5, core._programs["w0"], "test", _acc())
    _hold(core, "w0", 2_000, now=2.0)  # its next turn waits
    core.release(3.0, "resident")
    place_acting(core, "stays", 4_000, W)
    core.tick(4.0)
    assert core.program("w0").lifecycle is Lifecycle.ACTIVE
    assert core.program("idle").lifecycle is Lifecycle.PAUSED
    core.check_invariants(4.0)


def _acc():
    from services.scheduler.core.control import Acc

    return Acc()
