"""Tail protection: a program that has outlived most released programs is never paused for
pressure or for an aged admission, and resumes first (ours, not the reference's)."""

from __future__ import annotations

import pytest

from services.common.settings.errors import ConfigError
from services.scheduler.core import ControlParams, Lifecycle, ReplicaKey, Verdict
from services.scheduler.core.control import Pause, Plan
from tests.unit.scheduler.helpers import make_core, place_acting, place_reasoning, rid

W = ("w", 0)


def _run_turns(core, sid: str, turns: int, tokens: int, now: float = 0.0) -> None:
    for _ in range(turns):
        request_id = rid()
        core.admit(now, sid, "", tokens, request_id)
        core.complete(now, sid, request_id, ReplicaKey(*W), tokens, 0)


def _release_programs(core, turn_counts: list[int], now: float = 0.0) -> None:
    for i, turns in enumerate(turn_counts):
        sid = f"done-{i}"
        _run_turns(core, sid, turns, 100, now)
        assert core.release(now, sid)[0]


def test_off_by_default_in_the_core():
    assert ControlParams().tail_protection_quantile == 0.0
    core = make_core({W: 100_000})
    _release_programs(core, [2, 2, 2, 2, 2])
    _run_turns(core, "old", 10, 1_000)
    assert not core.ledger.is_tail(core.ledger.programs["old"])


def test_needs_enough_releases_and_uses_the_quantile():
    core = make_core({W: 100_000}, tail_protection_quantile=0.75)
    _run_turns(core, "old", 6, 1_000)
    _release_programs(core, [2, 3, 4])
    assert not core.ledger.is_tail(core.ledger.programs["old"]), "three releases are not evidence yet"
    _release_programs(core, [5])
    # Released turn counts {2, 3, 4, 5}: the 0.75 quantile is 5 (index floor(0.75 * 4) = 3).
    assert core.ledger.is_tail(core.ledger.programs["old"])  # 6 turns > 5
    _run_turns(core, "young", 5, 1_000)
    assert not core.ledger.is_tail(core.ledger.programs["young"])  # 5 turns is not more than 5


@pytest.mark.parametrize("quantile, paused_old", [(0.0, True), (0.75, False)])
def test_a_tail_program_is_not_paused_for_pressure(quantile, paused_old):
    core = make_core({W: 10_000}, tail_protection_quantile=quantile, resume_aging_seconds=0.0)
    _release_programs(core, [1, 1, 1, 1])
    # The old program is the shortest ACTING context, so the reference order would pause it first.
    _run_turns(core, "old", 5, 1_000)
    for i in range(4):
        place_acting(core, f"p{i}", 2_500, W)
    result = core.tick(1.0)
    assert result.paused >= 1
    assert (core.program("old").lifecycle is Lifecycle.PAUSED) is paused_old
    core.ledger.check_invariants(1.0)


def _park(core, sid: str, turns: int, tokens: int) -> str:
    """A program with `turns` finished turns, paused, whose next turn now waits."""
    _run_turns(core, sid, turns, tokens)
    core.apply(0.0, Plan((Pause(sid, "pressure"),)))
    request_id = rid()
    assert core.admit(1.0, sid, "", tokens, request_id).decision.verdict is Verdict.WAIT
    return request_id


@pytest.mark.parametrize("quantile, first", [(0.0, "young"), (0.5, "old")])
def test_a_waiting_tail_program_resumes_before_shorter_ones(quantile, first):
    core = make_core(
        {W: 10_000},
        tail_protection_quantile=quantile,
        resume_aging_seconds=0.0,
        pause_threshold=1.0,
        pause_target=0.95,
        resume_hysteresis=0.03,
        soft_demote_threshold=0.95,
    )
    _release_programs(core, [1, 1, 3, 3])  # tail: more than 3 turns
    place_reasoning(core, "filler", 6_000, W)  # in flight: counts fully on the resume side
    # Both run their turns before either parks: a held admission queues every new program behind it.
    _run_turns(core, "old", 4, 3_000)
    _run_turns(core, "young", 2, 500)
    requests = {"old": _park(core, "old", 0, 3_000), "young": _park(core, "young", 0, 500)}
    # Room for one of them: 9,700 - 6,100 = 3,600 < 3,100 + 600.
    resolved = [d.request_id for d in core.tick(3.0).resolutions]
    assert resolved == [requests[first]]
    core.ledger.check_invariants(3.0)


def test_the_quantile_is_validated():
    with pytest.raises(ConfigError, match="tail_protection_quantile"):
        ControlParams(tail_protection_quantile=1.0)
    with pytest.raises(ConfigError, match="tail_protection_quantile"):
        ControlParams(tail_protection_quantile=-0.1)
