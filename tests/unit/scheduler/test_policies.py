"""Table tests of the pause policy, the registry and the priority mapping."""

from __future__ import annotations

import pytest

from services.common.settings.errors import ConfigError
from services.scheduler.core import PAUSE_POLICIES, ReplicaKey, make_pause_policy, to_sglang_priority
from services.scheduler.core.model import Program, Status
from services.scheduler.core.policies import PauseContext, ThresholdPauseParams


def programs(spec):
    out = []
    for seq, (sid, status, tokens, marked) in enumerate(spec):
        p = Program(session_id=sid, parent_session_id="", created_at=0.0, seq=seq)
        p.status, p.token_total, p.marked = status, tokens, marked
        out.append(p)
    return out


A, R = Status.ACTING, Status.REASONING


@pytest.mark.parametrize(
    "spec, used, target, pause, mark, mark_all",
    [
        # smallest ACTING first, until within target
        ([("a", A, 300, False), ("b", A, 100, False), ("c", A, 200, False)], 900, 650, ("b", "c"), (), False),
        # ties follow creation order; marked ones are skipped
        ([("a", A, 100, True), ("b", A, 100, False), ("c", A, 100, False)], 600, 350, ("b", "c"), (), False),
        # not enough ACTING: mark just enough REASONING, smallest first
        (
            [("a", A, 100, False), ("r1", R, 500, False), ("r2", R, 200, False), ("r3", R, 300, False)],
            1400,
            900,
            ("a",),
            ("r2",),
            False,
        ),
        # upstream: mark every REASONING
        ([("a", A, 100, False), ("r1", R, 500, False), ("r2", R, 200, False)], 1100, 700, ("a",), ("r2", "r1"), True),
        # already-marked programs count as freed
        ([("r1", R, 500, True), ("r2", R, 200, False)], 900, 500, (), (), False),
        # within target: nothing
        ([("a", A, 100, False)], 200, 500, (), (), False),
    ],
)
def test_threshold_policy(spec, used, target, pause, mark, mark_all):
    policy = make_pause_policy("threshold", ThresholdPauseParams(mark_all_reasoning=mark_all))
    ctx = PauseContext(
        ReplicaKey("w", 0),
        programs(spec),
        used,
        target,
        sum(s[1] is R for s in spec),
        None,
        100,
        lambda p: p.token_total,
        0.0,
    )
    plan = policy.plan(ctx)
    assert (plan.pause, plan.mark) == (pause, mark)


def test_registry_is_explicit_and_refuses_unknown_names():
    assert set(PAUSE_POLICIES) == {"threshold", "cost_aware"}
    with pytest.raises(ConfigError):
        make_pause_policy("nope")
    with pytest.raises(ConfigError):
        make_pause_policy("threshold", params=object())


@pytest.mark.parametrize(
    "seconds, priority",
    [
        (0.0, 0),
        (1.0, 1),
        (-2.0, -2),
        (-1.0, -1),
        (0.4, 1),
        (-0.4, -1),
        (1.5, 2),
        (-2.5, -3),
        (10.0, 10),
    ],
)
def test_priority_mapping(seconds, priority):
    assert to_sglang_priority(seconds) == priority
