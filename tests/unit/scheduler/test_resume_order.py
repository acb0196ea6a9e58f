"""Resume order: the program-aware law resumes the smallest *effective* size first, a paused program
of T tokens that waited w seconds counting T / (1 + w / H); the reference resumes the smallest T
first (H = 0)."""

from __future__ import annotations

import pytest

from services.common.settings.errors import ConfigError
from services.scheduler.core import ControlParams, Lifecycle, ReplicaKey, Verdict
from services.scheduler.core.control import Pause, Plan
from tests.unit.scheduler.helpers import make_core, place_acting, rid

W = ("w", 0)


def _hold(core, sid: str, tokens: int, now: float) -> str:
    request_id = rid()
    assert core.admit(now, sid, "", tokens, request_id).decision.verdict is Verdict.WAIT
    return request_id


def _queue_big_then_small(small_at: float, **params):
    """A full 10K replica; `big` (4K) queues at t=1, `small` (2K) at `small_at`; at t=40 room for one
    of them frees up (the reference's resume ceiling is 85%: 8.5K - 4K - 100 of buffer). ACTING
    tokens do not decay here, so the resident ones count in full on the resume side."""
    core = make_core({W: 10_000}, resume_aging_seconds=0.0, acting_decay_tau_seconds=1e6, **params)
    place_acting(core, "resident", 9_000, W)
    _hold(core, "big", 4_000, now=1.0)
    _hold(core, "small", 2_000, now=small_at)
    core.release(39.0, "resident")
    place_acting(core, "stays", 4_000, W, now=39.0)
    core.tick(40.0)
    core.ledger.check_invariants(40.0)
    return core


def test_the_reference_resumes_the_smallest_first():
    core = _queue_big_then_small(small_at=38.0)
    assert core.program("small").lifecycle is Lifecycle.ACTIVE
    assert core.program("big").lifecycle is Lifecycle.PAUSED


@pytest.mark.parametrize(
    "small_at, first",
    [
        # big waited 39 s: 4000 / (1 + 39/10) = 816; small waited 2 s: 2000 / 1.2 = 1667.
        (38.0, "big"),
        # both waited about as long: 4000 / 4.9 = 816 against 2000 / 4.8 = 417.
        (2.0, "small"),
    ],
)
def test_a_long_wait_outweighs_size(small_at, first):
    core = _queue_big_then_small(small_at=small_at, resume_wait_discount_seconds=10.0)
    other = "small" if first == "big" else "big"
    assert core.program(first).lifecycle is Lifecycle.ACTIVE
    assert core.program(other).lifecycle is Lifecycle.PAUSED


def test_a_head_that_does_not_fit_is_skipped():
    core = make_core(
        {W: 10_000}, resume_aging_seconds=0.0, acting_decay_tau_seconds=1e6, resume_wait_discount_seconds=10.0
    )
    place_acting(core, "resident", 9_000, W)
    _hold(core, "huge", 8_000, now=1.0)  # waited longest: first in the order, but cannot fit
    _hold(core, "small", 2_000, now=38.0)
    core.release(39.0, "resident")
    place_acting(core, "stays", 4_000, W, now=39.0)
    core.tick(40.0)
    assert core.program("small").lifecycle is Lifecycle.ACTIVE, "the room is not left idle behind the head"
    assert core.program("huge").lifecycle is Lifecycle.PAUSED
    core.ledger.check_invariants(40.0)


def test_groups_still_come_first():
    # A paused ACTING program (group 2) that waited longer than a waiting turn (group 0) resumes after it.
    core = make_core(
        {W: 10_000}, resume_aging_seconds=0.0, acting_decay_tau_seconds=1e6, resume_wait_discount_seconds=10.0
    )
    place_acting(core, "idle", 2_500, W)
    core.apply(0.0, Plan((Pause("idle", "test"),)))
    place_acting(core, "resident", 9_000, W)
    request_id = rid()
    core.admit(1.0, "w0", "", 1_000, request_id)
    core.complete(1.0, "w0", request_id, ReplicaKey(*W), 1_000, 0)
    core.apply(1.5, Plan((Pause("w0", "test"),)))
    _hold(core, "w0", 2_000, now=2.0)  # its next turn waits
    core.release(39.0, "resident")
    place_acting(core, "stays", 4_000, W, now=39.0)
    core.tick(40.0)
    assert core.program("w0").lifecycle is Lifecycle.ACTIVE
    assert core.program("idle").lifecycle is Lifecycle.PAUSED
    core.ledger.check_invariants(40.0)


def test_the_discount_is_validated():
    with pytest.raises(ConfigError, match="resume_wait_discount_seconds >= 0"):
        ControlParams(resume_wait_discount_seconds=-1.0)
    with pytest.raises(ConfigError, match="finite"):
        ControlParams(resume_wait_discount_seconds=float("inf"))
