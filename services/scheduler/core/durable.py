"""Export and restore of the scheduler core's durable state (the records of state.py).

The shell's persistence (services/scheduler/persist.py) writes what `Ledger.take_changes` names,
one record at a time (`export_program`, `export_ticket`, `export_meta`), or everything at once
(`export_state`), and a new leader rebuilds an empty core with `restore`. Pure: no I/O, times are
the core's monotonic seconds.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from services.scheduler.core.accounting import Ledger, Passthrough, Turn
from services.scheduler.core.model import INFO, Acc, Effects, Lifecycle, LogRecord, Program, Status
from services.scheduler.core.params import TAIL_WINDOW_RELEASES
from services.scheduler.core.state import (
    STATE_FORMAT,
    TOTAL_NAMES,
    CoreMeta,
    CoreState,
    ProgramRecord,
    TicketRecord,
)

if TYPE_CHECKING:
    from services.scheduler.core.scheduler import SchedulerCore

__all__ = ["export_meta", "export_program", "export_state", "export_ticket", "restore"]


def export_program(ledger: Ledger, session_id: str) -> ProgramRecord | None:
    """The program's record; None when it no longer exists (delete it)."""
    p = ledger.programs.get(session_id)
    if p is None:
        return None
    return ProgramRecord(
        p.session_id,
        p.parent_session_id,
        p.created_at,
        p.seq,
        p.status,
        p.lifecycle,
        p.token_total,
        p.tokens_estimated,
        p.replica,
        p.last_replica,
        p.pause_protected_until,
        p.admission_epoch,
        p.turns,
        p.last_activity,
        p.acting_since,
        p.paused_since,
        ledger.paused.get(session_id),
    )


def export_ticket(ledger: Ledger, request_id: str) -> TicketRecord | None:
    """The ticket's record; None when it no longer exists (completed, expired, rolled back)."""
    turn = ledger.turns.get(request_id)
    if turn is not None:
        return TicketRecord(
            request_id, turn.session_id, turn.epoch, turn.started_at, turn.was_paused, confirmed=turn.confirmed
        )
    pt = ledger.passthrough.get(request_id)
    if pt is not None:
        return TicketRecord(request_id, "", 0, pt.started_at, tokens=pt.tokens, replica=pt.replica)
    return None


def export_meta(core: SchedulerCore) -> CoreMeta:
    ledger = core.ledger
    return CoreMeta(
        ledger.next_seq,
        ledger.next_pause_seq,
        tuple(ledger.released_turns),
        {name: getattr(core, name) for name in TOTAL_NAMES},
    )


def export_state(core: SchedulerCore) -> CoreState:
    """Everything `restore` needs; also resets change tracking (the export is the new baseline)."""
    ledger = core.ledger
    ledger.take_changes()
    tickets = [export_ticket(ledger, rid) for rid in (*ledger.turns, *ledger.passthrough)]
    return CoreState(
        tuple(export_program(ledger, sid) for sid in ledger.programs),  # type: ignore[misc]
        tuple(t for t in tickets if t is not None),
        export_meta(core),
    )


def restore(core: SchedulerCore, now: float, state: CoreState) -> Effects:
    """Rebuild the table from `state` (times already on this process's clock) into an empty core.

    A turn whose program waited in the paused queue had its Admit call end with the old process,
    and a turn whose ticket was not stored cannot be completed: a REASONING program without a
    stored ticket for its current turn is at a tool boundary as far as anyone can tell, so it is
    ACTING from `now`. Stored tickets of running turns get a fresh lease: their router renews
    them, or they lapse. Placements wait for the capacity snapshot (see Ledger.settle)."""
    ledger = core.ledger
    if ledger.programs or ledger.turns or ledger.passthrough:
        raise RuntimeError("restore needs an empty core")
    if state.meta.format > STATE_FORMAT:
        raise ValueError(f"state format {state.meta.format} is newer than this scheduler's ({STATE_FORMAT})")
    acc = Acc()
    meta = state.meta
    next_seq, next_pause_seq = meta.next_seq, meta.next_pause_seq
    # In creation order, as the table iterates (Ledger.check_invariants): the store keeps no order.
    for rec in sorted(state.programs, key=lambda rec: rec.seq):
        program = Program(
            session_id=rec.session_id,
            parent_session_id=rec.parent_session_id,
            created_at=rec.created_at,
            seq=rec.seq,
            status=rec.status,
            lifecycle=rec.lifecycle,
            token_total=max(0, rec.token_total),
            tokens_estimated=rec.tokens_estimated,
            replica=rec.replica,
            last_replica=rec.last_replica,
            pause_protected_until=rec.pause_protected_until,
            admission_epoch=rec.admission_epoch,
            turns=rec.turns,
            last_activity=rec.last_activity,
            acting_since=rec.acting_since,
            paused_since=rec.paused_since,
        )
        sid = program.session_id
        ledger.programs[sid] = program
        next_seq = max(next_seq, program.seq + 1)
        if program.lifecycle is Lifecycle.PAUSED:
            program.replica = None
            seq = rec.paused_seq if rec.paused_seq is not None else next_pause_seq
            ledger.paused[sid] = seq
            next_pause_seq = max(next_pause_seq, seq + 1)
        if program.parent_session_id:
            ledger.children.setdefault(program.parent_session_id, {})[sid] = None
        if program.replica is not None:
            ledger.unsettled.add(sid)
    ledger.next_seq, ledger.next_pause_seq = next_seq, next_pause_seq
    running: dict[str, int] = {}
    for ticket in state.tickets:
        if not ticket.session_id:
            ledger.passthrough[ticket.request_id] = Passthrough(
                ticket.request_id, max(0, ticket.tokens), ticket.replica, ticket.started_at, core.lease_until(now)
            )
            if ticket.replica is not None:
                ledger.unsettled_pt.add(ticket.request_id)
            continue
        owner = ledger.programs.get(ticket.session_id)
        if owner is None or ticket.epoch > owner.admission_epoch:
            continue  # its program is gone
        if owner.lifecycle is Lifecycle.PAUSED and ticket.epoch == owner.admission_epoch:
            # Held: its Admit call ended with the old process and its router asks again, so the turn
            # it counted is taken back (else the retry would count the same turn twice).
            owner.turns = max(0, owner.turns - 1)
            continue
        ledger.turns[ticket.request_id] = Turn(
            ticket.request_id,
            ticket.session_id,
            owner,
            ticket.epoch,
            ticket.started_at,
            dataclasses.replace(owner),
            ledger.paused.get(ticket.session_id),
            was_paused=ticket.was_paused,
            lease_until=core.lease_until(now),
            confirmed=ticket.confirmed,
            restored=True,
            before_lost=True,
        )
        running[ticket.session_id] = max(running.get(ticket.session_id, 0), ticket.epoch)
    ended = 0
    for program in ledger.programs.values():
        if program.status is Status.REASONING and running.get(program.session_id) != program.admission_epoch:
            program.status = Status.ACTING
            program.acting_since = now
            ended += 1
    ledger.released_turns.extend(meta.released_turns[-TAIL_WINDOW_RELEASES:])
    ledger.refresh_tail()
    for name in TOTAL_NAMES:
        setattr(core, name, int(meta.totals.get(name, 0)))
    for program in ledger.programs.values():
        ledger.recharge(program)
    if ledger.caps:
        ledger.settle()
    acc.logs.append(
        LogRecord(
            INFO,
            "scheduler.recovered programs=%d paused=%d tickets=%d ended_turns=%d"
            % (
                len(ledger.programs),
                len(ledger.paused),
                len(ledger.turns) + len(ledger.passthrough),
                ended,
            ),
        )
    )
    return acc.effects()
