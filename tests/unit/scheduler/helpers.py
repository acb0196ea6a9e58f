"""Builders shared by the scheduler core tests."""

from __future__ import annotations

from services.scheduler.core import (
    CapacitySnapshot,
    ControlParams,
    ReplicaCapacity,
    ReplicaKey,
    SchedulerCore,
    Status,
    Verdict,
)
from services.scheduler.core.control import ControlLaw
from services.scheduler.core.model import Program


def snapshot(caps: dict[tuple[str, int], int], version: int = 1, max_programs: dict | None = None) -> CapacitySnapshot:
    max_programs = max_programs or {}
    return CapacitySnapshot(
        version, tuple(ReplicaCapacity(w, r, tokens, max_programs.get((w, r), 0)) for (w, r), tokens in caps.items())
    )


def make_core(caps: dict[tuple[str, int], int] | None = None, now: float = 0.0, **params) -> SchedulerCore:
    core = SchedulerCore(ControlParams(**params))
    if caps is not None:
        core.apply_capacity(now, snapshot(caps))
    return core


_counter = [0]


def rid() -> str:
    _counter[0] += 1
    return f"req-{_counter[0]}"


def turn(
    core: SchedulerCore,
    sid: str,
    prompt: int,
    completion: int = 0,
    now: float = 0.0,
    replica: tuple[str, int] | None = None,
):
    """Admit one turn and, if it was placed, complete it (program ends ACTING)."""
    request_id = rid()
    result = core.admit(now, sid, "", prompt, request_id)
    if result.decision.verdict is Verdict.PLACED:
        where = ReplicaKey(*replica) if replica else result.decision.replica
        core.complete(now, sid, request_id, where, prompt, completion)
    return result


def place_acting(core: SchedulerCore, sid: str, tokens: int, replica: tuple[str, int], now: float = 0.0) -> None:
    """Create an ACTING program of `tokens` on `replica` regardless of headroom (the tests' `place()`)."""
    request_id = place_reasoning(core, sid, tokens, replica, now)
    core.complete(now, sid, request_id, ReplicaKey(*replica), tokens, 0)


def place_reasoning(core: SchedulerCore, sid: str, tokens: int, replica: tuple[str, int], now: float = 0.0) -> str:
    request_id = rid()
    core.admit(now, sid, "", tokens, request_id)
    ledger = core.ledger  # set up through the accounting's own API: no transition does this
    program = ledger.programs[sid]
    if program.lifecycle.value == "paused":  # force it in, whatever the headroom
        ledger.paused.pop(sid)
        program.lifecycle = type(program.lifecycle).ACTIVE
        program.paused_since = None
        ledger.waiting.pop(sid, None)
        ledger.turns[request_id].waiting = False
    program.replica = ReplicaKey(*replica)
    ledger.recharge(program)
    return request_id


def full_order_knapsack(law: ControlLaw, now: float, budget: int, total_slots: int | None) -> list[Program]:
    """The selection as specified: sort the whole paused queue by (resume group, effective size, pause
    order), then take each program whose req fits what is left (and, with slots, a REASONING one
    while a slot is left)."""
    ledger, p = law.ledger, law.params
    buffer = p.buffer_per_program_tokens

    def resume_key(sid: str) -> tuple[int, float, int]:
        q = ledger.programs[sid]
        size = float(q.token_total)
        if p.resume_wait_discount_seconds > 0:
            since = q.paused_since if q.paused_since is not None else now
            size /= 1.0 + max(0.0, now - since) / p.resume_wait_discount_seconds
        return (law.resume_group(q), size, ledger.paused[sid])

    selected: list[Program] = []
    cumulative = slots_needed = 0
    for sid in sorted(ledger.paused, key=resume_key):
        q = ledger.programs[sid]
        req = q.token_total + buffer
        takes_slot = q.status is Status.REASONING
        if takes_slot and total_slots is not None and slots_needed >= total_slots:
            continue
        if cumulative + req <= budget:
            selected.append(q)
            cumulative += req
            slots_needed += takes_slot
    return selected
