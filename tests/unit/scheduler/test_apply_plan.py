"""SchedulerCore.apply: a control-law plan carried out through the core's transitions, in order."""

from __future__ import annotations

from services.scheduler.core import EventKind, Lifecycle, LogRecord, ReplicaKey, Status
from services.scheduler.core.control import Mark, Pause, Plan, Resume, SoftDemote, Unmark
from tests.unit.scheduler.helpers import make_core, place_acting, place_reasoning

W = ("w", 0)
KEY = ReplicaKey(*W)


def test_each_step_takes_effect_in_order_with_its_events_and_totals():
    core = make_core({W: 100_000})
    place_acting(core, "a", 1_000, W)
    place_reasoning(core, "r", 1_000, W)
    line = LogRecord(20, "a line of the plan")
    effects = core.apply(
        1.0,
        Plan(
            (
                Pause("a", "test"),
                Mark("r", KEY),
                line,
                Resume("a", KEY, protect_until=9.0),
                SoftDemote(KEY, 5.0, ("a",), announce=("a",)),
            )
        ),
    )
    assert [e.kind for e in effects.events] == [
        EventKind.PAUSED,
        EventKind.MARKED,
        EventKind.RESUMED,
        EventKind.SOFT_DEMOTED,
    ]
    assert line in effects.logs
    a, r = core.program("a"), core.program("r")
    assert a.lifecycle is Lifecycle.ACTIVE and a.replica == KEY and a.soft_demoted
    assert r.marked and r.status is Status.REASONING
    stats = core.stats(1.0)
    assert (stats.pauses_total, stats.resumes_total, stats.marks_total) == (1, 1, 1)
    core.apply(1.0, Plan((Unmark("r"),)))
    assert not core.program("r").marked
    core.ledger.check_invariants(1.0)


def test_a_tick_announces_a_soft_demotion_once_per_window():
    core = make_core({W: 10_000})
    place_acting(core, "p", 8_000, W)  # (8000 * w_a + B) / 10000 sits in the soft-demote band
    first, second = core.tick(0.0), core.tick(1.0)
    assert [e.session_id for e in first.events if e.kind is EventKind.SOFT_DEMOTED] == ["p"]
    assert [e for e in second.events if e.kind is EventKind.SOFT_DEMOTED] == []
