"""The control law alone (core/control.py), over a hand-built ledger and recording actions."""

from __future__ import annotations

import pytest

from services.scheduler.core import (
    Band,
    CapacitySnapshot,
    ControlParams,
    Lifecycle,
    ReplicaCapacity,
    ReplicaKey,
    Status,
)
from services.scheduler.core.accounting import Ledger
from services.scheduler.core.control import ControlLaw, Mark, Pause, Plan, Resume, SoftDemote
from services.scheduler.core.policies import PausePlan, make_pause_policy

A = ReplicaKey("a", 0)
B = ReplicaKey("b", 0)
BUF = 100


def law(caps: dict[ReplicaKey, int], max_programs: int = 0, **params) -> ControlLaw:
    p = ControlParams(buffer_per_program_tokens=BUF, **params)
    led = Ledger(p)
    led.set_capacity(
        CapacitySnapshot(1, tuple(ReplicaCapacity(k.worker_id, k.dp_rank, t, max_programs) for k, t in caps.items()))
    )
    return ControlLaw(p, make_pause_policy(), led)


def put(control: ControlLaw, sid: str, tokens: int, key: ReplicaKey, status: Status = Status.ACTING):
    led = control.ledger
    program = led.create(0.0, sid, "")
    program.token_total = tokens
    program.status = status
    program.acting_since = 0.0 if status is Status.ACTING else None
    program.turns = 1
    led.place(program, key)
    led.recharge(program)
    return program


class Recorder:
    """Applies the law's plans to the ledger as the core would, and records the steps."""

    def __init__(self, control: ControlLaw) -> None:
        self.ledger = control.ledger
        self.calls: list[tuple[str, str]] = []

    def apply(self, plan: Plan) -> Plan:
        for step in plan.steps:
            if isinstance(step, Pause):
                self.pause(self.ledger.programs[step.session_id])
            elif isinstance(step, Resume):
                self.calls.append(("resume", step.session_id))
                program = self.ledger.programs[step.session_id]
                program.lifecycle = Lifecycle.ACTIVE
                self.ledger.paused.pop(program.session_id, None)
                if step.replica is not None:
                    self.ledger.place(program, step.replica)
                self.ledger.recharge(program)
            elif isinstance(step, Mark):
                self.calls.append(("mark", step.session_id))
                self.ledger.programs[step.session_id].marked = True
        return plan

    def pause(self, program) -> None:
        self.calls.append(("pause", program.session_id))
        program.lifecycle = Lifecycle.PAUSED
        program.replica = None
        self.ledger.enqueue_paused(program.session_id)
        self.ledger.recharge(program)


@pytest.mark.parametrize(
    "tokens, band",
    [
        (7_000, Band.NORMAL),  # (7000 + 100) / 10000 = 0.71
        (7_900, Band.SOFT_DEMOTE),  # 0.80 >= theta_s
        (9_300, Band.SOFT_DEMOTE),  # 0.94
        (9_400, Band.PAUSE),  # 0.95 >= theta_p
    ],
)
def test_band_by_utilisation(tokens: int, band: Band) -> None:
    control = law({A: 10_000})
    put(control, "p", tokens, A)
    assert control.band(A) is band


def test_band_by_program_count() -> None:
    control = law({A: 1_000_000}, max_programs=2)
    put(control, "p", 10, A, Status.REASONING)
    assert control.band(A) is Band.NORMAL
    put(control, "q", 10, A, Status.REASONING)
    put(control, "r", 10, A, Status.REASONING)
    assert control.band(A) is Band.PAUSE  # 3 / 2 > theta_p


def test_admission_goes_where_the_most_is_free_and_below_the_threshold() -> None:
    control = law({A: 10_000, B: 10_000})
    put(control, "big", 6_000, A)
    new = control.ledger.create(0.0, "new", "")
    new.token_total = 1_000
    assert control.choose_admission_replica(0.0, new, gate=False) == B
    assert control.choose_admission_replica(0.0, new, gate=True) is None
    put(control, "fill", 8_500, B)
    new.token_total = 4_000
    assert control.choose_admission_replica(0.0, new, gate=False) is None


@pytest.mark.parametrize(
    "status, turns, group",
    [
        (Status.REASONING, 3, 0),
        (Status.REASONING, 1, 1),
        (Status.ACTING, 3, 2),
    ],
)
def test_resume_groups(status: Status, turns: int, group: int) -> None:
    control = law({A: 10_000})
    program = control.ledger.create(0.0, "p", "")
    program.status, program.turns = status, turns
    assert control.resume_group(program) == group


def test_pause_over_threshold_pauses_acting_programs_until_the_target() -> None:
    control = law({A: 10_000})
    for sid, tokens in (("p1", 3_000), ("p2", 3_000), ("p3", 3_500)):
        put(control, sid, tokens, A)
    acts = Recorder(control)
    plan = acts.apply(control.plan_pauses(0.0))
    assert plan.count(Pause) >= 1 and plan.count(Mark) == 0
    assert all(kind == "pause" for kind, _ in acts.calls)
    assert control.ledger.used[A] <= 10_000 * control.params.pause_target
    control.ledger.check_invariants(0.0)


def test_pause_over_threshold_marks_reasoning_programs_it_cannot_pause() -> None:
    control = law({A: 10_000})
    put(control, "r", 9_800, A, Status.REASONING)
    acts = Recorder(control)
    plan = acts.apply(control.plan_pauses(0.0))
    assert (plan.count(Pause), plan.count(Mark)) == (0, 1)
    assert acts.calls == [("mark", "r")]


def test_resume_fills_headroom_smallest_first() -> None:
    control = law({A: 10_000})
    acts = Recorder(control)
    for sid, tokens in (("large", 6_000), ("small", 1_000)):
        program = put(control, sid, tokens, A)
        acts.pause(program)
    acts.calls.clear()
    put(control, "resident", 5_000, A, Status.REASONING)
    assert acts.apply(control.plan_resume(0.0)).count(Resume) == 1
    assert acts.calls == [("resume", "small")]
    control.ledger.check_invariants(0.0)


def test_soft_demote_emits_one_event_per_window() -> None:
    control = law({A: 10_000})
    put(control, "p", 8_000, A)
    first = control.plan_soft_demote(0.0)
    assert [(s.session_ids, s.announce) for s in first.steps if isinstance(s, SoftDemote)] == [(("p",), ("p",))]
    control.ledger.programs["p"].soft_demoted_until = first.steps[0].until  # as the core applies it
    second = control.plan_soft_demote(1.0)
    assert [(s.session_ids, s.announce) for s in second.steps if isinstance(s, SoftDemote)] == [(("p",), ())]


def test_planning_changes_nothing_in_the_ledger() -> None:
    control = law({A: 10_000, B: 10_000}, resume_aging_seconds=1.0)
    for sid, tokens in (("p1", 3_000), ("p2", 3_000), ("p3", 3_500)):
        put(control, sid, tokens, A)
    put(control, "r", 1_000, B, Status.REASONING)
    Recorder(control).pause(put(control, "q", 2_000, B))
    led = control.ledger
    before = (dict(led.used), dict(led.paused), {sid: repr(p) for sid, p in led.programs.items()})
    plans = [
        control.plan_soft_demote(5.0),
        control.plan_resume(5.0),
        control.plan_aging(5.0),
        control.plan_forced(5.0),
        control.plan_pauses(5.0),
    ]
    assert (dict(led.used), dict(led.paused), {sid: repr(p) for sid, p in led.programs.items()}) == before
    assert any(plan.steps for plan in plans)


def test_the_pause_plan_carries_the_charges_it_takes_off_into_its_log_line() -> None:
    control = law({A: 10_000})
    for sid, tokens in (("p1", 3_000), ("p2", 3_000), ("p3", 3_500)):
        put(control, sid, tokens, A)
    plan = control.plan_pauses(0.0)
    line = [step.message for step in plan.steps if not isinstance(step, (Pause, Mark))]
    Recorder(control).apply(plan)
    assert line == [line[0].rsplit("-> ", 1)[0] + "-> %.4f" % (control.ledger.used[A] / 10_000)]


def test_a_policy_that_chooses_a_program_twice_is_refused_before_anything_happens() -> None:
    control = law({A: 10_000})
    for sid, tokens in (("p1", 3_000), ("p2", 3_000), ("p3", 3_500)):
        put(control, sid, tokens, A)

    class Twice:
        name = "twice"

        def plan(self, ctx):
            return PausePlan(pause=("p1", "p1"), mark=())

    control.policy = Twice()  # type: ignore[assignment]
    with pytest.raises(ValueError, match="twice"):
        control.plan_pauses(0.0)
    assert not control.ledger.paused
