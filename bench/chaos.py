"""`make bench-chaos` / `python -m bench.chaos`: agent load and a batch through the full stack under random faults.

    python -m bench.chaos --seeds 0,1,2 --out bench/results/chaos.json [--quick] [--duration-s 600]

Starts the whole stack on loopback with fixed ports (so that a restarted process binds the same ones):
a Redis server (the scheduler's program table, `--state-redis-url`, and the planner's leases,
`--lease-store redis`), simulated workers, the capacity service, the scheduler (two, active and
standby, when `services.launcher.cluster.ClusterConfig` has `scheduler_replicas`), two independent router
processes sharing the HTTP and gRPC ports (SO_REUSEPORT, `--reuse-port`: what `--router-processes`
starts as its children, here each its own supervised process so that one can die while the other
serves) and the planner. Then, for `--duration-s`, it keeps `--programs` SWE-agent programs in flight
through the routers' OpenAI API, submits one Batch API batch of `--batch-requests` requests, and a
seeded fault injector works through its schedule (`fault_schedule`, a pure function of the seed):
each fault SIGKILLs (then restarts after a bounded downtime), SIGSTOPs (then SIGCONTs after a bounded
freeze) or gracefully restarts (SIGTERM, then the same command line) one process of one kind:
simworker, capacity, scheduler (the active one), router, planner, redis. A restarted process is
started again with its own command line, environment and working directory, read from /proc before
the fault (`bandmaster up` stops the cluster when a child dies; it does not restart it).

Invariants (checked at the end over the recorded events by the pure `check_*` functions; each breach is
one entry of the report's `violations`):

* no program lost. A program is lost when (a) one of its turns could not be completed within the
  retry budget (`--retry-budget-s` wall seconds from the turn's first attempt: a turn may see clean
  errors and is then retried), (b) it was still running when the drain ended, or (c) the scheduler
  no longer knew it at its end (GetProgram NOT_FOUND just before the final request) although some
  of its turns were admitted outside every scheduler fault window (see below).
* scheduler turns == client turns, per program. The client's count is its requests that the router
  answered `200` (the router started the turn: it was admitted, or failed open); the scheduler's is
  `Program.turns` read with GetProgram after the program's last turn (settled: see DISPATCHED_SETTLE_S),
  before its final request. More
  in the scheduler than in the client is a phantom turn, always a violation. Fewer is a missing turn,
  excused only for requests that overlapped a scheduler fault window, from the fault's injection
  less the state store's flush interval (the most a SIGKILL may lose) to the scheduler answering again
  plus the routers' fail-open bounds (decision deadline + breaker retry): such turns are routed fail
  open by design and never reach the scheduler.
* every client stream ended: with `[DONE]` (tokens, or an SSE error event), or a non-200 with an
  OpenAI-style body (`{"error": {"message": ...}}`). A stream that ends without `[DONE]` or an error
  event is cut silently: a violation. A connection lost mid-request is allowed only while the router
  process the client may have been connected to was being killed or restarted (a router fault window);
  any other one is a violation.
* every batch `custom_id` exactly once in the output and error files together, the batch completed
  within its bound.
* every wait within its bound: each request has a timeout (`--turn-timeout-s`); a timeout is a violation,
  as is a faulted process that does not answer again within `--recovery-timeout-s`, a scheduler
  lookup that gets no answer within its bound, or a batch not done within `--batch-timeout-s`.

Figures: per fault, the time from injection to the service answering again (`service_answering_s`:
gRPC health SERVING, HTTP /health 200, Redis PONG) and to the next successful turn started after the
injection (`next_ok_turn_s`); per (kind, action), their median and maximum.

Exit status: 0 when no seed has a violation, 1 otherwise, 2 on invalid flags. The report (`--out`)
holds one entry per seed (its schedule, the faults as executed, counts, violations) and the totals.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Awaitable, Callable, Iterator, Sequence

from bench.config_flags import add_config_flags, config_from_args
from clients.workloads import Program
from services.common.process.child_start import start_child
from services.common.process.child_stop import stop_child
from services.common.settings.config import require
from services.common.settings.errors import ConfigError

MODEL = "bandmaster-sim"
KINDS = ("simworker", "capacity", "scheduler", "router", "planner", "redis")
ACTIONS = ("kill", "freeze", "restart")
STATE_FLUSH_S = 0.1
"""The scheduler's --state-flush-seconds in this run: the most of its table a SIGKILL can lose."""
TICKET_LEASE_S = 10.0
"""The scheduler's --ticket-lease-seconds in this run: a turn admitted for a router that died before it
confirmed the turn is rolled back when its lease lapses, so a program's count settles this long after."""
DISPATCHED_SETTLE_S = 5.0 + 2.0
"""How long after a program's last turn the scheduler may still be learning of it: on the admission fast
path a turn runs on its cached admission and its Admit goes in the background, after the program's previous
Complete, within the routers' failover bound (5 s) plus a decision deadline (2 s). The client can finish
the turn before that Admit lands, so a lookup that reads fewer turns than the client started waits for it
up to this bound (a phantom, more turns, is never waited on)."""
ROUTER_FAIL_OPEN_S = 2.0 + 1.0 + 1.0
"""After a scheduler fault, how long a router may still route a turn fail open: its Admit decision deadline
(2 s), then its breaker's retry interval (1 s) before it asks again, and a second of slack."""


@dataclass(frozen=True)
class ChaosConfig:
    """One chaos run (per seed): the load, the stack it runs on and the faults."""

    duration_s: float = 600.0
    """Wall seconds of load and faults; then no new program starts and the drain begins."""
    programs: int = 48
    """Programs in flight at once (a finished one is replaced at once)."""
    workers: int = 3
    worker_kv_tokens: int = 131_072
    speedup: float = 4.0
    max_turns: int = 6
    token_scale: float = 0.5
    tool_time_scale: float = 0.5
    """Tool waits between turns, as a share of the trace's (shorter waits: more turns in flight per fault)."""
    ramp_s: float = 10.0
    """Wall seconds over which the slots start their first program (spread: no lockstep)."""
    batch_requests: int = 200
    fault_gap_s: tuple[float, float] = (10.0, 25.0)
    """Wall seconds between one fault's recovery and the next fault's injection (uniform)."""
    freeze_s: tuple[float, float] = (1.0, 8.0)
    """How long a SIGSTOP lasts before the SIGCONT (uniform)."""
    down_s: tuple[float, float] = (0.5, 4.0)
    """How long a SIGKILLed process stays down before it is started again (uniform)."""
    first_fault_s: float = 15.0
    faults: int = 0
    """Faults to inject; 0 = as many as fit in the duration, every (kind, action) pair first."""
    trace: bool = False
    """Every service writes the spans of turns to `<state dir>/traces/<name>.jsonl` (`bandmaster trace`
    reads them): per-turn evidence for a violation, kept with the logs."""
    only: tuple[str, ...] = ()
    """Inject only these `kind/action` pairs (`scheduler/freeze`; `redis` = every action of it); () = all.
    For replaying one fault kind against the full stack."""
    turn_timeout_s: float = 60.0
    retry_budget_s: float = 120.0
    recovery_timeout_s: float = 60.0
    drain_s: float = 180.0
    batch_timeout_s: float = 300.0
    """Wall seconds after the load's end the batch may take to reach a terminal status."""
    lookup_timeout_s: float = 30.0
    """Longest wait for the scheduler to answer GetProgram (it may be restarting)."""
    redis_persistence: str = "always"
    """Redis's append-only file: `always` (fsync per write), `everysec`, or `none` (a killed Redis comes
    back empty: the store loses the scheduler's table and the planner's leases)."""
    stop_timeout_s: float = 20.0
    """Longest wait for a process to exit after its SIGTERM (its shutdown grace is 5 s); then SIGKILL."""

    def __post_init__(self) -> None:
        require(self.duration_s > 0, "duration_s", self.duration_s, "duration_s > 0")
        require(self.programs >= 1, "programs", self.programs, "programs >= 1")
        require(1 <= self.workers <= 16, "workers", self.workers, "1 <= workers <= 16")
        require(self.speedup > 0, "speedup", self.speedup, "speedup > 0")
        require(self.max_turns >= 1, "max_turns", self.max_turns, "max_turns >= 1")
        require(self.batch_requests >= 0, "batch_requests", self.batch_requests, "batch_requests >= 0")
        for name in ("fault_gap_s", "freeze_s", "down_s"):
            lo, hi = getattr(self, name)
            require(0 <= lo <= hi, name, (lo, hi), f"0 <= {name}[0] <= {name}[1]")
        require(self.faults >= 0, "faults", self.faults, "faults >= 0")
        for pair in self.only:
            kind, _, action = pair.partition("/")
            require(
                kind in KINDS and action in ("", *ACTIONS),
                "only",
                pair,
                f"kind[/action] with kind one of {', '.join(KINDS)} and action one of {', '.join(ACTIONS)}",
            )
        require(
            self.redis_persistence in ("always", "everysec", "none"),
            "redis_persistence",
            self.redis_persistence,
            "always, everysec or none",
        )
        require(
            self.freeze_s[1] + 10.0 < self.turn_timeout_s,
            "turn_timeout_s",
            self.turn_timeout_s,
            "turn_timeout_s > freeze_s[1] + 10 (a request may wait out a whole freeze)",
        )
        require(self.retry_budget_s >= self.turn_timeout_s, "retry_budget_s", self.retry_budget_s, ">= turn_timeout_s")


FULL = ChaosConfig()
QUICK = ChaosConfig(
    duration_s=50.0,
    programs=10,
    workers=2,
    worker_kv_tokens=65_536,
    speedup=10.0,
    max_turns=4,
    token_scale=0.5,
    ramp_s=8.0,
    batch_requests=20,
    fault_gap_s=(3.0, 6.0),
    freeze_s=(1.0, 3.0),
    down_s=(0.5, 1.5),
    first_fault_s=5.0,
    faults=5,
    turn_timeout_s=30.0,
    retry_budget_s=45.0,
    recovery_timeout_s=45.0,
    drain_s=60.0,
    batch_timeout_s=120.0,
    lookup_timeout_s=20.0,
)
"""For the test suite: about 90 s with start-up and drain; five faults, the scheduler's SIGKILL among them."""
QUICK_MUST = (("scheduler", "kill"), ("router", "kill"))
"""Pairs a --quick schedule always holds (the rest are drawn)."""


# ------------------------------------------------------------------------------ the schedule


@dataclass(frozen=True)
class Fault:
    at_s: float
    """Planned injection, wall seconds from the load's start (the shell injects no earlier, and later
    when the previous fault has not recovered yet)."""
    kind: str
    action: str
    instance: int
    """Which process of the kind (simworker i, router i); 0 for the singletons and the active scheduler."""
    hold_s: float
    """freeze: seconds stopped; kill: seconds down before the restart; restart: 0."""

    @property
    def target(self) -> str:
        return f"{self.kind}-{self.instance}" if self.kind in ("simworker", "router") else self.kind


def fault_schedule(
    seed: int,
    duration_s: float,
    instances: dict[str, int],
    *,
    first_s: float,
    gap_s: tuple[float, float],
    freeze_s: tuple[float, float],
    down_s: tuple[float, float],
    count: int = 0,
    must: Sequence[tuple[str, str]] = (),
    only: Sequence[str] = (),
) -> list[Fault]:
    """The faults of one run, a function of the seed alone. Every (kind, action) pair of the kinds in
    `instances` comes once, in a seeded order (`must` pairs first when `count` limits the run), then
    random pairs, one fault after another: each planned `gap_s` after the previous one's hold ends.
    `count` 0 = as many as start before `duration_s`; else exactly `count` (planned times may then pass
    `duration_s`, and the shell injects them late). `only` (`kind/action` or `kind`) keeps those pairs."""
    rng = random.Random(f"chaos:{seed}")
    kinds = [k for k in KINDS if instances.get(k, 0) > 0]
    pairs = [(k, a) for k in kinds for a in ACTIONS]
    if only:
        pairs = [(k, a) for k, a in pairs if f"{k}/{a}" in only or k in only]
        require(bool(pairs), "only", list(only), f"none of these faults applies to this stack ({', '.join(kinds)})")
    rng.shuffle(pairs)
    chosen = [p for p in must if p in pairs]
    order = chosen + [p for p in pairs if p not in chosen]
    faults: list[Fault] = []
    t = first_s
    while True:
        if count and len(faults) >= count:
            break
        if not count and t >= duration_s:
            break
        kind, action = order[len(faults)] if len(faults) < len(order) else rng.choice(pairs)
        instance = rng.randrange(instances[kind]) if kind in ("simworker", "router") else 0
        if action == "freeze":
            hold = round(rng.uniform(*freeze_s), 2)
        elif action == "kill":
            hold = round(rng.uniform(*down_s), 2)
        else:
            hold = 0.0
        faults.append(Fault(round(t, 2), kind, action, instance, hold))
        t += hold + rng.uniform(*gap_s)
    return faults


# ------------------------------------------------------------------------ recorded events


@dataclass
class RequestRecord:
    """One HTTP request of the load (a turn's attempt, or a final request)."""

    program_id: str
    turn: int
    """The turn's index; -1 for the final request."""
    attempt: int
    start_s: float
    end_s: float = 0.0
    status: int = 0
    """HTTP status; 0 when no response headers came."""
    outcome: str = ""
    """ok | error_event | http_error | http_error_unclean | transport_before_headers |
    transport_after_headers | silent_cut | empty | timeout"""
    tokens: int = 0
    error: str = ""
    admission: str = ""
    """The router's X-Bandmaster-Admission: admitted | cached | fail-open | off ("" when not answered)."""

    @property
    def scheduler_end_s(self) -> float:
        """Until when the scheduler may still be learning of the turn: its end, or for a turn the router
        started on a cached admission (its Admit sent in the background), DISPATCHED_SETTLE_S after."""
        return self.end_s + (DISPATCHED_SETTLE_S if self.admission == "cached" else 0.0)

    @property
    def started(self) -> bool:
        """The router started the turn: it answered 200 (admitted, or failed open)."""
        return self.status == 200


@dataclass
class ProgramOutcome:
    program_id: str
    turns_planned: int
    turns_done: int = 0
    finished: bool = False
    gave_up_turn: int | None = None
    """The turn that could not be completed within the retry budget (the program is lost)."""
    scheduler_turns: int | None = None
    """Program.turns from GetProgram after the last turn; None = not read."""
    scheduler_known: bool | None = None
    """False: GetProgram said NOT_FOUND; None: no answer within the bound (or not asked)."""
    lookup_s: float | None = None


@dataclass
class FaultRecord:
    fault: Fault
    injected_s: float
    resumed_s: float | None = None
    """When the process was started again (kill, restart) or SIGCONTed (freeze)."""
    answering_s: float | None = None
    """When the service answered again (absolute, load clock)."""
    exited_s: float | None = None
    """When the process had exited (kill, restart)."""
    back_s: float | None = None
    """When the faulted process itself answered again (its replacement, or itself after the SIGCONT)."""
    answered_by: str = ""
    """Replicated kinds: the replica that led when the service answered again."""
    stop_overran: bool = False
    """A graceful restart whose SIGTERM did not stop the process within its bound (then SIGKILLed)."""
    error: str = ""

    def window(self) -> tuple[float, float]:
        """[injection, answering again] (or to the injection + hold when it never answered)."""
        end = self.answering_s if self.answering_s is not None else self.injected_s + self.fault.hold_s
        return self.injected_s, end


CLEAN = frozenset({"ok", "error_event", "http_error", "transport_before_headers"})
"""Outcomes that are never a violation by themselves (a refused connection is a clean 'not started')."""


def _overlaps(start: float, end: float, windows: Sequence[tuple[float, float]]) -> bool:
    return any(start <= w_end and end >= w_start for w_start, w_end in windows)


def scheduler_windows(
    faults: Sequence[FaultRecord], outages: Sequence[tuple[float, float]] = (), *, store_decides: bool = False
) -> list[tuple[float, float]]:
    """Where a turn may have been routed fail open or lost by the scheduler's crash: per scheduler fault,
    and per outage the watcher observed (no scheduler leading and serving, whatever the fault: a Redis
    outage deposes a leader too), [start - flush interval, end + the routers' fail-open bounds].
    `store_decides` (leader election): a leader refuses every decision its store does not take
    (UNAVAILABLE, the router fails open) while still leading and serving, so a Redis fault is one too."""
    kinds = ("scheduler", "redis") if store_decides else ("scheduler",)
    spans = [f.window() for f in faults if f.fault.kind in kinds] + list(outages)
    return [(start - STATE_FLUSH_S - 0.5, end + ROUTER_FAIL_OPEN_S) for start, end in spans]


def router_windows(faults: Sequence[FaultRecord]) -> list[tuple[float, float]]:
    """Where a client connection may be lost with its router process: from a router's kill or restart
    to its answering again (a freeze stalls connections, it does not close them)."""
    return [f.window() for f in faults if f.fault.kind == "router" and f.fault.action in ("kill", "restart")]


def dropped_ticket_lapse(dropped_s: float, takeovers: Sequence[tuple[float, float]]) -> float:
    """When the ticket of a turn its router dropped at `dropped_s` has lapsed at the latest (and its count been
    rolled back, if its client never saw it): one lease after the drop, or after the end of a takeover that
    began before that (a new leader restores every running ticket with a fresh lease), and so on."""
    until = dropped_s + TICKET_LEASE_S + 2.0
    while True:
        later = [end + TICKET_LEASE_S + 2.0 for start, end in takeovers if end >= dropped_s and start <= until]
        extended = max([until, *later])
        if extended <= until:
            return until
        until = extended


def check_streams(requests: Sequence[RequestRecord], faults: Sequence[FaultRecord]) -> list[dict]:
    """Every stream ended with [DONE] or an error, or was refused cleanly; a connection lost mid-request
    is allowed only in a router fault window."""
    routers = router_windows(faults)
    out = []
    for r in requests:
        if r.outcome in CLEAN:
            continue
        if r.outcome == "transport_after_headers" and _overlaps(r.start_s, r.end_s, routers):
            continue
        kind = {"timeout": "wait_over_bound"}.get(r.outcome, "stream_" + r.outcome)
        out.append(
            {
                "invariant": "streams" if kind != "wait_over_bound" else "waits",
                "kind": kind,
                "program": r.program_id,
                "turn": r.turn,
                "attempt": r.attempt,
                "at_s": round(r.start_s, 2),
                "detail": r.error[:200],
            }
        )
    return out


def check_turns(
    programs: Sequence[ProgramOutcome],
    requests: Sequence[RequestRecord],
    faults: Sequence[FaultRecord],
    outages: Sequence[tuple[float, float]] = (),
    *,
    store_decides: bool = False,
) -> tuple[list[dict], dict]:
    """Scheduler turns against the client's started turns, per program that was looked up. Returns the
    violations and the counts (programs compared, turns excused as fail-open, attempts cut by a router fault).

    An attempt whose stream a router's kill or restart cut after its headers (the client retries the turn)
    may be counted or not: the scheduler counts a turn once its router reports that the client received
    something, and a router killed between its first bytes to the client and that report (batched, within
    DELIVERED_FLUSH_S of services/router/adapters/scheduler.py) takes the fact with it. Closing that window
    would cost every turn a scheduler round trip before its first byte; so either count is right for such an
    attempt, and no other.

    A turn the router started on a cached admission (X-Bandmaster-Admission: cached) is excused by a window
    that overlaps it or the DISPATCHED_SETTLE_S after it: its Admit goes to the scheduler in the background."""
    windows = scheduler_windows(faults, outages, store_decides=store_decides)
    routers = router_windows(faults)
    started: dict[str, list[RequestRecord]] = defaultdict(list)
    failed: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in requests:
        if r.turn >= 0 and r.started:
            started[r.program_id].append(r)
        if r.turn >= 0 and r.outcome != "ok":
            failed[r.program_id].append(r)
    out = []
    compared = excused_total = cut_total = 0
    for p in programs:
        if p.scheduler_known is None:
            continue
        mine = started.get(p.program_id, [])
        client = len(mine)
        cut = [r for r in mine if r.outcome == "transport_after_headers" and _overlaps(r.start_s, r.end_s, routers)]
        cut_total += len(cut)
        excusable = sum(1 for r in mine if r in cut or _overlaps(r.start_s, r.scheduler_end_s, windows))
        scheduler = (p.scheduler_turns or 0) if p.scheduler_known else 0
        compared += 1
        if scheduler > client:
            out.append(_turn_violation("phantom_turns", p, client, scheduler, excusable, failed[p.program_id], mine))
        elif client - scheduler > excusable:
            kind = "program_unknown" if not p.scheduler_known else "missing_turns"
            out.append(_turn_violation(kind, p, client, scheduler, excusable, failed[p.program_id], mine))
        else:
            excused_total += client - scheduler
    return out, {
        "programs_compared": compared,
        "turns_excused_fail_open": excused_total,
        "attempts_cut_by_router_faults": cut_total,
    }


def _turn_violation(
    kind: str,
    p: ProgramOutcome,
    client: int,
    scheduler: int,
    excusable: int,
    failed: Sequence[RequestRecord],
    started: Sequence[RequestRecord] = (),
) -> dict:
    """The violation, with the program's attempts that did not end ok (where to look in the logs)."""
    return {
        "invariant": "turns" if kind != "program_unknown" else "lost",
        "kind": kind,
        "program": p.program_id,
        "client_started_turns": client,
        "scheduler_turns": scheduler,
        "excusable_fail_open": excusable,
        "started_turns": [[r.turn, round(r.start_s, 2), round(r.end_s, 2)] for r in started],
        "failed_attempts": [
            {
                "turn": r.turn,
                "attempt": r.attempt,
                "outcome": r.outcome,
                "start_s": round(r.start_s, 3),
                "end_s": round(r.end_s, 3),
                "error": r.error[:120],
            }
            for r in failed
        ],
    }


def check_programs(programs: Sequence[ProgramOutcome], config: ChaosConfig) -> list[dict]:
    """Lost (a) a turn not done within the retry budget, (b) unfinished after the drain; lookups that got
    no answer within their bound."""
    out = []
    for p in programs:
        if p.gave_up_turn is not None:
            out.append(
                {
                    "invariant": "lost",
                    "kind": "turn_not_done_within_retry_budget",
                    "program": p.program_id,
                    "turn": p.gave_up_turn,
                    "budget_s": config.retry_budget_s,
                }
            )
        elif not p.finished:
            out.append({"invariant": "lost", "kind": "unfinished_after_drain", "program": p.program_id})
        elif p.scheduler_known is None:
            out.append(
                {
                    "invariant": "waits",
                    "kind": "scheduler_lookup_unanswered",
                    "program": p.program_id,
                    "bound_s": config.lookup_timeout_s,
                }
            )
    return out


def check_batch(batch: dict | None, expected_ids: Sequence[str]) -> list[dict]:
    """Every custom_id exactly once over the output and error files; the batch completed."""
    if not expected_ids:
        return []
    if batch is None:
        return [{"invariant": "batch", "kind": "batch_not_submitted"}]
    out = []
    if batch.get("status") != "completed":
        out.append({"invariant": "batch", "kind": "batch_not_completed", "status": batch.get("status")})
        return out
    seen = Counter(batch.get("output_ids", [])) + Counter(batch.get("error_ids", []))
    expected = Counter(expected_ids)
    missing = sorted(set(expected) - set(seen))
    twice = sorted(i for i, n in seen.items() if n > 1)
    unknown = sorted(set(seen) - set(expected))
    for kind, ids in (("batch_missing_ids", missing), ("batch_duplicate_ids", twice), ("batch_unknown_ids", unknown)):
        if ids:
            out.append({"invariant": "batch", "kind": kind, "count": len(ids), "ids": ids[:20]})
    return out


def check_recovery(faults: Sequence[FaultRecord], config: ChaosConfig) -> list[dict]:
    """The service answers again within its bound after every fault, and a SIGTERM stops a process within
    its bound."""
    out = []
    for f in faults:
        where = {"target": f.fault.target, "action": f.fault.action, "at_s": round(f.injected_s, 2)}
        if f.answering_s is None or f.back_s is None:
            what = "service" if f.answering_s is None else "faulted process"
            detail = f.error or f"the {what} did not answer again"
            out.append(
                {
                    "invariant": "waits",
                    "kind": "not_answering_after_fault",
                    **where,
                    "bound_s": config.recovery_timeout_s,
                    "detail": detail,
                }
            )
        if f.stop_overran:
            out.append({"invariant": "waits", "kind": "stop_over_bound", **where, "bound_s": config.stop_timeout_s})
    return out


def next_ok_turn_s(fault: FaultRecord, requests: Sequence[RequestRecord]) -> float | None:
    """From the injection to the end of the first successful turn started after it."""
    ends = [r.end_s for r in requests if r.turn >= 0 and r.outcome == "ok" and r.start_s >= fault.injected_s]
    return round(min(ends) - fault.injected_s, 3) if ends else None


def fault_rows(faults: Sequence[FaultRecord], requests: Sequence[RequestRecord]) -> list[dict]:
    rows = []
    for f in faults:
        answering = round(f.answering_s - f.injected_s, 3) if f.answering_s is not None else None
        failed = [
            r
            for r in requests
            if r.outcome not in ("ok",) and _overlaps(r.start_s, r.end_s, [f.window()]) and r.turn >= 0
        ]
        rows.append(
            {
                **asdict(f.fault),
                "target": f.fault.target,
                "injected_s": round(f.injected_s, 2),
                "exited_after_s": round(f.exited_s - f.injected_s, 3) if f.exited_s is not None else None,
                "resumed_after_s": round(f.resumed_s - f.injected_s, 3) if f.resumed_s is not None else None,
                "service_answering_s": answering,
                "process_back_s": round(f.back_s - f.injected_s, 3) if f.back_s is not None else None,
                "answered_by": f.answered_by,
                "stop_overran": f.stop_overran,
                "next_ok_turn_s": next_ok_turn_s(f, requests),
                "failed_requests_in_window": dict(Counter(r.outcome for r in failed)),
                "error": f.error,
            }
        )
    return rows


def recovery_summary(rows: Sequence[dict]) -> dict[str, dict]:
    """Per kind/action: count, median and max of service_answering_s and next_ok_turn_s."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        groups[f"{row['kind']}/{row['action']}"].append(row)
    out = {}
    for key in sorted(groups):
        entry: dict = {"faults": len(groups[key])}
        for figure in ("service_answering_s", "next_ok_turn_s"):
            values = [r[figure] for r in groups[key] if r[figure] is not None]
            entry[figure] = (
                {"median": round(statistics.median(values), 3), "max": round(max(values), 3)} if values else None
            )
        out[key] = entry
    return out


def error_summary(requests: Sequence[RequestRecord], top: int = 15) -> dict:
    """The failed attempts by what they said (outcome, status, the error's first words), most common first,
    and when they happened (10-second buckets of their start)."""
    failed = [r for r in requests if r.outcome != "ok"]
    kinds = Counter(f"{r.outcome} {r.status or ''} {r.error[:70]}".replace("  ", " ").strip() for r in failed)
    buckets = Counter(int(r.start_s // 10) * 10 for r in failed)
    return {
        "by_kind": dict(kinds.most_common(top)),
        "by_10s_from": {str(t): n for t, n in sorted(buckets.items())},
    }


def invariant_table(violations: Sequence[dict]) -> list[dict]:
    names = ("lost", "turns", "streams", "batch", "waits")
    counts = Counter(v["invariant"] for v in violations)
    return [
        {"name": n, "violations": counts.get(n, 0), "status": "PASS" if not counts.get(n) else "MISS"} for n in names
    ]


def build_report(
    config: ChaosConfig,
    seed: int,
    schedule: Sequence[Fault],
    faults: Sequence[FaultRecord],
    programs: Sequence[ProgramOutcome],
    requests: Sequence[RequestRecord],
    batch: dict | None,
    expected_ids: Sequence[str],
    stack: dict,
    wall_s: float,
    outages: Sequence[tuple[float, float]] = (),
) -> dict:
    """One seed's report: every check over the recorded events, the faults with their figures, counts."""
    store_decides = bool(stack.get("scheduler_failover"))
    turn_violations, turn_counts = check_turns(programs, requests, faults, outages, store_decides=store_decides)
    violations = [
        *check_programs(programs, config),
        *turn_violations,
        *check_streams(requests, faults),
        *check_batch(batch, expected_ids),
        *check_recovery(faults, config),
    ]
    rows = fault_rows(faults, requests)
    turns = [r for r in requests if r.turn >= 0]
    return {
        "seed": seed,
        "stack": stack,
        "wall_s": round(wall_s, 1),
        "schedule": [asdict(f) for f in schedule],
        "scheduler_outages": [[round(a, 2), round(b, 2)] for a, b in outages],
        "faults": rows,
        "recovery": recovery_summary(rows),
        "programs": {
            "started": len(programs),
            "finished": sum(1 for p in programs if p.finished),
            "looked_up": sum(1 for p in programs if p.scheduler_known is not None),
            **turn_counts,
        },
        "requests": {
            "turn_attempts": len(turns),
            "turns_ok": sum(1 for r in turns if r.outcome == "ok"),
            "retried_turns": len({(r.program_id, r.turn) for r in turns if r.attempt > 0}),
            "outcomes": dict(Counter(r.outcome for r in turns).most_common()),
            "finals": dict(Counter(r.outcome for r in requests if r.turn < 0).most_common()),
            "errors": error_summary(turns),
        },
        "slowest_requests": [
            {**asdict(r), "took_s": round(r.end_s - r.start_s, 3)}
            for r in sorted(requests, key=lambda r: r.end_s - r.start_s, reverse=True)[:10]
        ],
        "batch": {k: v for k, v in (batch or {}).items() if k not in ("output_ids", "error_ids")},
        "invariants": invariant_table(violations),
        "violations": violations,
    }


# ---------------------------------------------------------------------------------- the shell


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


_TAKEN: set[int] = set()
"""Ports this process has handed out (a run's processes must not share one)."""


def _port_range() -> tuple[int, int]:
    """Ports to choose from: below the kernel's ephemeral range, which outgoing connections take ports from
    at any time (a port bound to 0 and released is one of those, and may be gone by the time a restarted
    process binds it again)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32_768
    return (10_000, low) if low > 12_000 else (low, 65_000)


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_run(n: int, tries: int = 500, step: int = 1) -> int:
    """A free loopback port `base` with base + step, ..., base + (n - 1) step free too (the simulated workers
    count up from it by 1, the scheduler replicas by 10), none handed out before."""
    rng = random.Random()
    lo, hi = _port_range()
    for _ in range(tries):
        base = rng.randrange(lo, hi - n * step)
        ports = range(base, base + n * step, step)
        if all(p not in _TAKEN and _bindable(p) for p in ports):
            _TAKEN.update(ports)
            return base
    raise RuntimeError(f"no {n} free ports {step} apart in {lo}-{hi}")


def _free_port() -> int:
    return _free_run(1)


@dataclass
class LaunchedCommand:
    """How to start a process again exactly as it was: argv, environment, working directory."""

    argv: list[str]
    env: dict[str, str]
    cwd: str


def read_command(pid: int, fixed: LaunchedCommand | None = None) -> LaunchedCommand:
    """The command line, environment and cwd of a live process, from /proc; `fixed` for a program that
    rewrites its own title, as redis-server does: its title overwrites the memory /proc shows as its
    argv and its environment (a relaunch from what /proc showed lost PYTHONPATH, and so the orphan
    guard of this tree)."""
    if fixed is not None:
        return fixed
    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    argv = [a.decode() for a in raw.split(b"\0") if a]
    env = {}
    for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        if b"=" in item:
            key, value = item.split(b"=", 1)
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return LaunchedCommand(argv, env, os.readlink(f"/proc/{pid}/cwd"))


def launch(command: LaunchedCommand, log_path: Path) -> subprocess.Popen:
    """Start `command` (from the event loop's thread: the orphan guard ties the child to this thread)."""
    return start_child(command.argv, log_path, env=command.env, cwd=command.cwd)


@dataclass
class Target:
    """One restartable process of the stack and how to tell it answers."""

    name: str
    kind: str
    instance: int
    get: Callable[[], subprocess.Popen]
    put: Callable[[subprocess.Popen], None]
    log_path: Path
    probe: Callable[[], Awaitable[bool]]
    ready_file: Path | None = None
    fixed: LaunchedCommand | None = None
    """How to start it again, for a process /proc cannot tell (redis-server rewrites its title)."""


async def _http_ok(session, url: str) -> bool:
    import aiohttp

    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=1.0)) as response:
            await response.read()
            return response.status == 200
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return False


async def _grpc_serving(address: str) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    try:
        async with grpc.aio.insecure_channel(address) as channel:
            answer = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1.0)
            return answer.status == health_pb2.HealthCheckResponse.SERVING
    except (grpc.RpcError, asyncio.TimeoutError):
        return False


async def _redis_pong(port: int) -> bool:
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 1.0)
    except (OSError, asyncio.TimeoutError):
        return False
    try:
        writer.write(b"PING\r\n")
        await writer.drain()
        return (await asyncio.wait_for(reader.read(16), 1.0)).startswith(b"+PONG")
    except (OSError, asyncio.TimeoutError):
        return False
    finally:
        writer.close()


def redis_argv(port: int, work_dir: Path, persistence: str) -> list[str]:
    """redis-server as the deployments run it (append-only file, no RDB snapshots; docker-compose.yml,
    deploy/kubernetes), fsync'd on every write with `always` (a SIGKILL then loses no acknowledged write,
    so whatever is lost is lost by Bandmaster), once a second with `everysec` (Redis's default), or with
    no persistence at all with `none` (a restarted Redis is empty)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise FileNotFoundError("redis-server is not installed (make system-deps installs it)")
    args = ["--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    if persistence == "none":
        args += ["--appendonly", "no"]
    else:
        args += ["--appendonly", "yes", "--appendfsync", persistence]
    return [binary, *args, "--dir", str(work_dir), "--protected-mode", "no"]


def scheduler_replicas_supported() -> bool:
    """Whether the cluster launcher can start an active/standby scheduler pair (the failover work)."""
    from services.launcher.cluster import ClusterConfig

    return "scheduler_replicas" in ClusterConfig.__dataclass_fields__


class Stack:
    """The processes of one run: Redis, the cluster as `bandmaster up` starts it (fixed ports), a second
    router on the same ports, and a Target per process the injector may hit."""

    def __init__(self, config: ChaosConfig, state_dir: Path) -> None:
        self.config = config
        self.state_dir = state_dir
        self.redis_port = _free_port()
        self.redis: subprocess.Popen | None = None
        self.cluster = None
        self.targets: dict[str, Target] = {}
        self.scheduler_addresses: list[str] = []
        self.http_url = ""
        self.second_router = None
        self.describe: dict = {}

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    def start(self) -> None:
        from services.common.process import orphan_guard
        from services.launcher.cluster import ClusterConfig, ClusterPorts, router_spec, start_cluster
        from services.launcher.probes import wait_for_workers
        from services.launcher.supervisor import Supervisor

        config = self.config
        redis_dir = self.state_dir / f"redis-{self.redis_port}"  # its own append-only file, per start
        redis_dir.mkdir(parents=True, exist_ok=True)
        argv = redis_argv(self.redis_port, redis_dir, config.redis_persistence)
        self.redis_argv = orphan_guard.command(sys.executable, "--exec", argv)
        self.redis_command = LaunchedCommand(self.redis_argv, dict(os.environ), str(self.state_dir))
        self.redis = launch(self.redis_command, self._redis_log)
        deadline = time.monotonic() + 10
        while not asyncio.run(_redis_pong(self.redis_port)):
            if time.monotonic() > deadline or self.redis.poll() is not None:
                raise RuntimeError(f"redis-server did not answer PING (log {self._redis_log})")
            time.sleep(0.05)
        two_schedulers = scheduler_replicas_supported()
        replicas = 2 if two_schedulers else 1
        ports = ClusterPorts(
            capacity=_free_port(),
            scheduler=_free_run(replicas, step=10),
            router=_free_port(),
            planner=_free_port(),
            batch=_free_port(),
            batch_http=_free_port(),
            capacity_metrics=_free_port(),
            scheduler_metrics=_free_run(replicas, step=10),
            router_metrics=_free_port(),
            planner_metrics=_free_port(),
            batch_metrics=_free_port(),
            first_worker=_free_run(config.workers),
        )
        extra = {"scheduler_replicas": replicas} if two_schedulers else {}
        cluster_config = ClusterConfig(
            workers=config.workers,
            worker_kv_tokens=config.worker_kv_tokens,
            worker_speedup=config.speedup,
            model_name=MODEL,
            http_port=_free_port(),
            state_dir=self.state_dir,
            log_level="INFO",
            extra_worker_args=("--log-level", "WARNING"),
            scheduler_args=(
                "--state-redis-url",
                self.redis_url,
                "--state-flush-seconds",
                str(STATE_FLUSH_S),
                "--ticket-lease-seconds",
                str(TICKET_LEASE_S),
            ),
            router_args=("--reuse-port",),
            planner=True,
            planner_args=("--lease-store", "redis", "--redis-url", self.redis_url),
            ports=ports,
            trace=config.trace,
            **extra,
        )
        supervisor = Supervisor(self.state_dir)
        self.cluster = cluster = start_cluster(cluster_config, supervisor)
        # The second router: the same flags, ports and batch service; its own metrics port.
        batch_url = f"http://127.0.0.1:{ports.batch_http}"
        second = replace(cluster_config, ports=replace(ports, router_metrics=_free_port()))
        scheduler_addr = getattr(cluster, "scheduler_addrs", "") or cluster.scheduler.endpoint
        spec = router_spec(second, cluster.capacity.endpoint, scheduler_addr, batch_url)
        spec.args = [*spec.args]
        spec.name = "router-1"
        (self.second_router,) = supervisor.start_all([spec])
        self.http_url = cluster.http_url
        wait_for_workers(cluster.capacity.endpoint, config.workers)
        self.scheduler_addresses = [
            c.endpoint for c in supervisor.children if c.spec.name.startswith("scheduler") and c.spec.kind == "grpc"
        ]
        self._targets(supervisor)
        self.describe = {
            "workers": config.workers,
            "routers": 2,
            "schedulers": len(self.scheduler_addresses),
            "scheduler_failover": two_schedulers,
            "state_store": "redis",
            "redis_persistence": config.redis_persistence,
            "lease_store": "redis",
            "planner": True,
        }

    @property
    def _redis_log(self) -> Path:
        return self.state_dir / "redis.log"

    def _targets(self, supervisor) -> None:
        import aiohttp

        self._session: aiohttp.ClientSession | None = None

        def session():
            if self._session is None or self._session.closed:
                self._session = aiohttp.ClientSession()
            return self._session

        def of_child(child, name: str, kind: str, instance: int, probe) -> Target:
            def put(process, child=child):
                child.process = process

            return Target(
                name, kind, instance, lambda c=child: c.process, put, child.log_path, probe, ready_file=child.ready_file
            )

        workers = [c for c in supervisor.children if c.spec.name.startswith("simworker-")]
        for i, child in enumerate(workers):
            url = child.endpoint + "/health"
            self.targets[f"simworker-{i}"] = of_child(
                child, f"simworker-{i}", "simworker", i, lambda u=url: _http_ok(session(), u)
            )
        routers = [self.cluster.router, self.second_router]
        for i, child in enumerate(routers):
            url = f"http://127.0.0.1:{child.ready['metrics_port']}/metrics"

            async def router_up(u=url, c=child) -> bool:
                return c.ready_file.exists() and await _http_ok(session(), u)

            self.targets[f"router-{i}"] = of_child(child, f"router-{i}", "router", i, router_up)
        for name in ("capacity", "planner"):
            child = getattr(self.cluster, name)
            self.targets[name] = of_child(child, name, name, 0, lambda a=child.endpoint: _grpc_serving(a))
        schedulers = [c for c in supervisor.children if c.spec.name.startswith("scheduler")]
        for i, child in enumerate(schedulers):
            self.targets[f"scheduler-{i}"] = of_child(
                child, child.spec.name, "scheduler", i, lambda a=child.endpoint: _grpc_serving(a)
            )

        def redis_put(process):
            self.redis = process

        self.targets["redis"] = Target(
            "redis",
            "redis",
            0,
            lambda: self.redis,
            redis_put,
            self._redis_log,
            lambda: _redis_pong(self.redis_port),
            fixed=self.redis_command,
        )

    def instances(self) -> dict[str, int]:
        return {
            "simworker": self.config.workers,
            "capacity": 1,
            "scheduler": 1,
            "router": 2,
            "planner": 1,
            "redis": 1,
        }

    async def active_scheduler(self) -> str:
        """The target name of the scheduler that decides: the leader, or the only one."""
        names = sorted(n for n in self.targets if n.startswith("scheduler-"))
        if len(names) == 1:
            return names[0]
        for name in names:
            if await self._role(self.scheduler_addresses[int(name.split("-")[1])]) in ("leader", "single"):
                return name
        return names[0]

    async def _role(self, address: str) -> str:
        return (await self._leadership(address))[0]

    async def _leadership(self, address: str) -> tuple[str, int]:
        """(role, epoch) of a replica; ("", 0) when it does not answer."""
        import grpc

        from bandmaster.scheduler.v1 import scheduler_pb2 as pb
        from bandmaster.scheduler.v1 import scheduler_pb2_grpc as pb_grpc

        request = getattr(pb, "GetLeadershipRequest", None)
        if request is None:
            return "single", 0
        try:
            async with grpc.aio.insecure_channel(address) as channel:
                answer = await pb_grpc.SchedulerStub(channel).GetLeadership(request(), timeout=1.0)
                return answer.role, int(answer.epoch)
        except (grpc.RpcError, asyncio.TimeoutError, AttributeError):
            return "", 0

    async def scheduler_up(self) -> bool:
        """Some scheduler decides: the leader serves (or the only one serves)."""
        return (await self.scheduler_term()) is not None

    async def scheduler_term(self) -> int | None:
        """The leadership epoch of the scheduler that decides (0 with one replica); None when none does."""
        if len(self.scheduler_addresses) == 1:
            return 0 if await _grpc_serving(self.scheduler_addresses[0]) else None
        for address in self.scheduler_addresses:
            role, epoch = await self._leadership(address)
            if role == "leader" and await _grpc_serving(address):
                return epoch
        return None

    def replicated(self, kind: str) -> bool:
        """Whether another process of the kind takes over the faulted one's role (active/standby)."""
        return kind == "scheduler" and len(self.scheduler_addresses) > 1

    async def serving_leader(self, exclude: str | None) -> str | None:
        """The name of a scheduler replica that leads and serves, other than `exclude`; None if none."""
        for i, address in enumerate(self.scheduler_addresses):
            name = f"scheduler-{i}"
            if name != exclude and await self._role(address) == "leader" and await _grpc_serving(address):
                return name
        return None

    async def get_program(self, session_id: str):
        """(True, Program) or (False, None) for NOT_FOUND, from the scheduler that decides; None when none
        answers (a standby's FAILED_PRECONDITION is no answer)."""
        import grpc

        from bandmaster.scheduler.v1 import scheduler_pb2 as pb
        from bandmaster.scheduler.v1 import scheduler_pb2_grpc as pb_grpc

        for address in self.scheduler_addresses:
            try:
                async with grpc.aio.insecure_channel(address) as channel:
                    program = await pb_grpc.SchedulerStub(channel).GetProgram(
                        pb.GetProgramRequest(session_id=session_id), timeout=2.0
                    )
                    return True, program
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.NOT_FOUND:
                    return False, None
            except asyncio.TimeoutError:
                pass
        return None

    async def close_session(self) -> None:
        if getattr(self, "_session", None) is not None:
            await self._session.close()

    def stop(self) -> None:
        if self.cluster is not None:
            # A process left stopped would not see its SIGTERM.
            for child in self.cluster.supervisor.children:
                if child.process.poll() is None:
                    try:
                        os.kill(child.process.pid, signal.SIGCONT)
                    except OSError:
                        pass
            self.cluster.stop()
        stop_child(self.redis, 10.0, name="redis-server")  # SIGTERM + SIGCONT (a frozen one), then SIGKILL


class Injector:
    """Works through the schedule, one fault at a time: inject, hold, undo, wait for the service to answer."""

    def __init__(self, stack: Stack, schedule: Sequence[Fault], config: ChaosConfig, start: float) -> None:
        self.stack = stack
        self.schedule = schedule
        self.config = config
        self.start = start
        self.records: list[FaultRecord] = []
        self.busy: FaultRecord | None = None
        """The fault in progress (injected, not yet answering again)."""
        self.quiet = asyncio.Event()
        self.quiet.set()

    def now(self) -> float:
        return time.monotonic() - self.start

    async def run(self, stop_injecting_at_s: float | None) -> None:
        for fault in self.schedule:
            delay = fault.at_s - self.now()
            if delay > 0:
                await asyncio.sleep(delay)
            if stop_injecting_at_s is not None and self.now() >= stop_injecting_at_s:
                break
            await self.inject(fault)

    async def inject(self, fault: Fault) -> FaultRecord:
        name = await self.stack.active_scheduler() if fault.kind == "scheduler" else fault.target
        target = self.stack.targets[name]
        process = target.get()
        command = read_command(process.pid, target.fixed)
        record = FaultRecord(fault, self.now())
        self.records.append(record)
        self.busy = record
        self.quiet.clear()
        _log(f"bench.chaos: t={record.injected_s:.1f}s {fault.action} {name} (hold {fault.hold_s:g}s)")
        # A replicated service answers again when another replica takes over, whatever the faulted one does.
        failover = asyncio.create_task(self._failover(record, name)) if self.stack.replicated(fault.kind) else None
        try:
            if fault.action == "freeze":
                os.kill(process.pid, signal.SIGSTOP)
                await asyncio.sleep(fault.hold_s)
                os.kill(process.pid, signal.SIGCONT)
            else:
                if fault.action == "kill":
                    process.kill()
                    await self._exited(process, 10.0)
                    record.exited_s = self.now()
                    await asyncio.sleep(fault.hold_s)
                else:
                    process.terminate()
                    if not await self._exited(process, self.config.stop_timeout_s):
                        record.stop_overran = True
                        process.kill()
                        await self._exited(process, 10.0)
                    record.exited_s = self.now()
                if target.ready_file is not None:
                    target.ready_file.unlink(missing_ok=True)
                target.put(launch(command, target.log_path))
            record.resumed_s = self.now()
            deadline = time.monotonic() + self.config.recovery_timeout_s
            while time.monotonic() < deadline:
                if target.get().poll() is not None:
                    record.error = f"{name} exited with {target.get().returncode} after the fault"
                    break
                if await target.probe():
                    record.back_s = self.now()
                    break
                await asyncio.sleep(0.05)
            if failover is not None:
                await failover
            elif record.back_s is not None:
                record.answering_s = record.back_s
            if record.back_s is None and not record.error:
                record.error = f"{name} did not answer within {self.config.recovery_timeout_s:g}s"
        except Exception as exc:  # the run goes on; the record says what broke
            record.error = f"{type(exc).__name__}: {exc}"
        finally:
            if failover is not None and not failover.done():
                failover.cancel()
            self.busy = None
            self.quiet.set()
        took = f"{record.answering_s - record.injected_s:.2f}s" if record.answering_s is not None else record.error
        _log(f"bench.chaos: {fault.kind} answering again after {took}")
        return record

    async def _failover(self, record: FaultRecord, faulted: str) -> None:
        """Until a replica leads and serves: another one, or the faulted one once it is back."""
        deadline = time.monotonic() + self.config.recovery_timeout_s
        while time.monotonic() < deadline:
            leader = await self.stack.serving_leader(exclude=None if record.back_s is not None else faulted)
            if leader is not None:
                record.answering_s = self.now()
                record.answered_by = leader
                return
            await asyncio.sleep(0.05)

    @staticmethod
    async def _exited(process: subprocess.Popen, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while process.poll() is None:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.02)
        return True


class SchedulerWatch:
    """Every 0.1 s: does a scheduler lead and serve, and in which term? Records each interval where none
    did (an outage), and each change of leader between two samples that both found one (a failover too
    quick for a sample to fall in it, as a leader whose loop stalled past its lease on a loaded machine
    and was replaced at once: its turns in flight fail open all the same): from the last sample of the
    old term to the first of the new."""

    def __init__(self, stack: Stack, start: float) -> None:
        self.stack = stack
        self.start = start
        self.outages: list[tuple[float, float]] = []
        self._down_since: float | None = None
        self._term: tuple[int, float] | None = None  # (epoch, when last seen)

    @property
    def down(self) -> bool:
        return self._down_since is not None

    async def run(self) -> None:
        try:
            while True:
                now = time.monotonic() - self.start
                term = await self.stack.scheduler_term()
                up = term is not None
                if not up and self._down_since is None:
                    self._down_since = now
                elif up and self._down_since is not None:
                    self.outages.append((self._down_since, time.monotonic() - self.start))
                    self._down_since = None
                elif up and self._term is not None and term != self._term[0]:
                    self.outages.append((self._term[1], time.monotonic() - self.start))
                if up:
                    self._term = (term, time.monotonic() - self.start)
                await asyncio.sleep(0.1)
        finally:
            if self._down_since is not None:
                self.outages.append((self._down_since, time.monotonic() - self.start))


# ------------------------------------------------------------------------------------ the load


def program_stream(config: ChaosConfig, seed: int) -> Iterator[Program]:
    """Endless distinct SWE programs: batches of `programs` draws, each batch with its own seed."""
    from clients.player import build_workload

    batch = 0
    while True:
        for program in build_workload(
            "swe",
            config.programs,
            seed=seed * 1000 + batch,
            max_turns=config.max_turns,
            token_scale=config.token_scale,
            tool_time_scale=config.tool_time_scale,
        ):
            yield replace(program, program_id=f"chaos{seed}.{program.program_id}.{batch}")
        batch += 1


def classify_error_body(text: str) -> bool:
    """An OpenAI-style error body: {"error": {"message": "..."}}."""
    try:
        body = json.loads(text)
    except ValueError:
        return False
    error = body.get("error") if isinstance(body, dict) else None
    return isinstance(error, dict) and isinstance(error.get("message"), str)


class Load:
    """Agent programs through the routers, every request recorded; a failed turn is retried within the budget."""

    def __init__(
        self, stack: Stack, injector: Injector, watch: SchedulerWatch, config: ChaosConfig, seed: int, start: float
    ) -> None:
        self.stack = stack
        self.injector = injector
        self.watch = watch
        self.config = config
        self.seed = seed
        self.start = start
        self.requests: list[RequestRecord] = []
        self.programs: list[ProgramOutcome] = []
        self.rng = random.Random(f"load:{seed}")
        self.running = 0
        self.endings: list[asyncio.Task] = []
        """Each finished program's look-up and final request."""

    def now(self) -> float:
        return time.monotonic() - self.start

    async def run(self, deadline_s: float) -> None:
        import aiohttp

        from clients.player import SYSTEM_PROMPT_TOKENS, text_of_n_tokens

        programs = program_stream(self.config, self.seed)
        self.system = text_of_n_tokens(SYSTEM_PROMPT_TOKENS, 0)
        self.text = text_of_n_tokens
        timeout = aiohttp.ClientTimeout(total=self.config.turn_timeout_s, sock_connect=5)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
            self.session = session

            async def slot(index: int) -> None:
                await asyncio.sleep(self.config.ramp_s * index / self.config.programs)
                while self.now() < deadline_s:
                    program = next(programs)
                    outcome = ProgramOutcome(program.program_id, len(program.turns))
                    self.programs.append(outcome)
                    self.running += 1
                    try:
                        await self._play(program, outcome)
                    finally:
                        self.running -= 1

            tasks = [asyncio.create_task(slot(i)) for i in range(self.config.programs)]
            await asyncio.wait(tasks, timeout=max(0.0, deadline_s - self.now()))
            _, pending = await asyncio.wait(tasks, timeout=self.config.drain_s)
            for task in pending:
                task.cancel()
            # The endings' look-ups are bounded (settling + lookup_timeout_s), their finals by turn_timeout_s.
            # (A takeover during a dropped ticket's lease gives it one more: see dropped_ticket_lapse.)
            bound = 2 * (TICKET_LEASE_S + 2.0) + self.config.lookup_timeout_s + 2 * self.config.turn_timeout_s
            _, late = await asyncio.wait(self.endings, timeout=bound) if self.endings else (set(), set())
            for task in late:
                task.cancel()
            for result in await asyncio.gather(*tasks, *self.endings, return_exceptions=True):
                if isinstance(result, Exception) and not isinstance(result, asyncio.CancelledError):
                    _log(f"bench.chaos: a load slot failed: {type(result).__name__}: {result}")

    async def _play(self, program: Program, outcome: ProgramOutcome) -> None:
        from clients.player import SESSION, SYSTEM_PROMPT_TOKENS

        rng = random.Random(f"{self.seed}:{program.program_id}")
        messages: list[dict] = [{"role": "system", "content": self.system}]
        headers = {SESSION: program.program_id}
        for k, turn in enumerate(program.turns):
            new_tokens = max(1, program.new_prompt_tokens(k) - (SYSTEM_PROMPT_TOKENS if k == 0 else 0))
            messages.append({"role": "user", "content": self.text(new_tokens, rng.randrange(1 << 30))})
            text = await self._turn_with_retries(program.program_id, k, messages, turn.output_tokens, headers)
            if text is None:
                outcome.gave_up_turn = k
                break
            outcome.turns_done += 1
            messages.append({"role": "assistant", "content": text})
            if turn.tool_seconds_after > 0:
                await asyncio.sleep(turn.tool_seconds_after / self.config.speedup)
        outcome.finished = outcome.turns_done == outcome.turns_planned
        # The look-up may wait for the program's count to settle (a lease to lapse): the slot moves on to
        # its next program meanwhile; the final request, which takes the program out of the table, follows.
        self.endings.append(asyncio.create_task(self._end(outcome)))

    async def _end(self, outcome: ProgramOutcome) -> None:
        if outcome.finished:
            await self._look_up(outcome)
        await self._final(outcome.program_id)

    async def _turn_with_retries(
        self, program_id: str, k: int, messages: list[dict], output_tokens: int, headers: dict
    ) -> str | None:
        first = time.monotonic()
        attempt = 0
        while True:
            record, text = await self._request(program_id, k, attempt, messages, output_tokens, headers)
            self.requests.append(record)
            if record.outcome == "ok":
                return text
            backoff = min(2.0, 0.2 * 2**attempt) * (0.5 + self.rng.random())
            if time.monotonic() + backoff - first > self.config.retry_budget_s:
                return None
            await asyncio.sleep(backoff)
            attempt += 1

    async def _request(
        self, program_id: str, k: int, attempt: int, messages: list[dict], output_tokens: int, headers: dict
    ) -> tuple[RequestRecord, str]:
        import aiohttp

        body = {
            "model": MODEL,
            "messages": messages,
            "max_tokens": output_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0,
            "ignore_eos": True,
        }
        record = RequestRecord(program_id, k, attempt, self.now())
        pieces: list[str] = []
        headers_seen = done = error_event = False
        try:
            async with self.session.post(f"{self.stack.http_url}/v1/chat/completions", json=body, headers=headers) as r:
                record.status = r.status
                record.admission = r.headers.get("X-Bandmaster-Admission", "")
                headers_seen = True
                if r.status != 200:
                    text = await r.text()
                    record.outcome = "http_error" if classify_error_body(text) else "http_error_unclean"
                    record.error = f"HTTP {r.status}: {text[:200]}"
                else:
                    async for raw in r.content:
                        if not raw.startswith(b"data: "):
                            continue
                        payload = raw[6:].strip()
                        if payload == b"[DONE]":
                            done = True
                            break
                        chunk = json.loads(payload)
                        if "error" in chunk:
                            error_event = True
                            record.error = str(chunk["error"])[:200]
                            continue
                        for choice in chunk.get("choices", ()):
                            delta = (choice.get("delta") or {}).get("content")
                            if delta:
                                pieces.append(delta)
                            if choice.get("finish_reason") in ("abort", "error"):
                                error_event = True
                                record.error = record.error or f"finish_reason={choice['finish_reason']}"
                    if error_event:
                        record.outcome = "error_event"
                    elif done:
                        record.outcome = "ok" if pieces else "empty"
                    else:
                        record.outcome = "silent_cut"
                        record.error = f"the stream ended after {len(pieces)} pieces without [DONE] or an error"
        except asyncio.TimeoutError:
            record.outcome = "timeout"
            record.error = (
                f"no end within {self.config.turn_timeout_s:g}s (headers {'seen' if headers_seen else 'not seen'})"
            )
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            record.outcome = "transport_after_headers" if headers_seen else "transport_before_headers"
            record.error = f"{type(exc).__name__}: {exc}"[:200]
        record.end_s = self.now()
        record.tokens = len(pieces)
        return record, "".join(pieces)

    def _takeovers(self) -> list[tuple[float, float]]:
        """Every interval where a scheduler may have taken over the table (a scheduler or Redis fault, an
        outage or a change of leader the watcher saw)."""
        faults = [f.window() for f in self.injector.records if f.fault.kind in ("scheduler", "redis")]
        return faults + list(self.watch.outages)

    async def _look_up(self, outcome: ProgramOutcome) -> None:
        """The scheduler's turn count once it can have settled: no scheduler or router fault in progress,
        the lease of a turn a router may have dropped has lapsed, and (while it reads fewer turns than the
        client started) for up to DISPATCHED_SETTLE_S, the bound of a fast-path turn's background Admit."""
        started = time.monotonic()
        mine = [r for r in self.requests if r.program_id == outcome.program_id]
        while True:
            busy = self.injector.busy
            if (busy is None or busy.fault.kind != "router") and not self.watch.down:
                break
            await asyncio.sleep(0.1)
        windows = router_windows(self.injector.records)
        touched = [r.end_s for r in mine if _overlaps(r.start_s, r.end_s, windows)]
        if touched:
            while True:
                wait = dropped_ticket_lapse(max(touched), self._takeovers()) - self.now()
                if wait <= 0 and not self.watch.down:
                    break
                await asyncio.sleep(max(wait, 0.1))
        deadline = time.monotonic() + self.config.lookup_timeout_s
        client_turns = sum(1 for r in mine if r.turn >= 0 and r.started)
        settle_until = time.monotonic() + DISPATCHED_SETTLE_S
        while time.monotonic() < deadline:
            answer = await self.stack.get_program(outcome.program_id)
            if answer is not None:
                known, program = answer
                if known and int(program.turns) < client_turns and time.monotonic() < settle_until:
                    await asyncio.sleep(0.2)  # a fast-path turn's Admit may still be on its way
                    continue
                outcome.scheduler_known = known
                outcome.scheduler_turns = int(program.turns) if known else None
                outcome.lookup_s = round(time.monotonic() - started, 2)
                return
            await asyncio.sleep(0.3)

    async def _final(self, program_id: str) -> None:
        """Release the program; retried for a while. Its failure is no violation (the scheduler expires an
        idle program), but it is recorded."""
        import aiohttp

        from clients.player import FINAL, SESSION

        body = {"model": MODEL, "messages": []}
        first = time.monotonic()
        attempt = 0
        while True:
            record = RequestRecord(program_id, -1, attempt, self.now())
            try:
                async with self.session.post(
                    f"{self.stack.http_url}/v1/chat/completions",
                    json=body,
                    headers={SESSION: program_id, FINAL: "true"},
                ) as r:
                    record.status = r.status
                    await r.read()
                    record.outcome = "ok" if r.status == 200 else "http_error"
            except asyncio.TimeoutError:
                record.outcome = "timeout"
            except (aiohttp.ClientError, OSError) as exc:
                record.outcome = "transport_before_headers"
                record.error = type(exc).__name__
            record.end_s = self.now()
            self.requests.append(record)
            if record.outcome == "ok" or time.monotonic() - first > self.config.turn_timeout_s:
                return
            attempt += 1
            await asyncio.sleep(0.5)


# ----------------------------------------------------------------------------------- the batch


def batch_lines(n: int, seed: int) -> tuple[bytes, list[str]]:
    ids = [f"chaos{seed}-r{i}" for i in range(n)]
    lines = [
        json.dumps(
            {
                "custom_id": cid,
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": MODEL, "messages": [{"role": "user", "content": f"say {i}"}], "max_tokens": 8},
            }
        )
        for i, cid in enumerate(ids)
    ]
    return ("\n".join(lines) + "\n").encode(), ids


class BatchClient:
    """One batch through the routers' Batch API: upload, create (found again by its metadata tag when a
    create's answer is lost), poll until terminal, read the output and error files. Every call retried."""

    def __init__(self, stack: Stack, config: ChaosConfig, seed: int) -> None:
        self.stack = stack
        self.config = config
        self.seed = seed
        self.tag = f"chaos-{seed}-{os.getpid()}-{time.time_ns()}"
        self.result: dict | None = None
        self.errors: Counter = Counter()

    async def _call(self, session, method: str, path: str, deadline: float, **kwargs):
        import aiohttp

        while True:
            try:
                async with session.request(method, self.stack.http_url + path, **kwargs) as r:
                    data = await r.read()
                    if r.status == 200:
                        return data
                    self.errors[f"http_{r.status}"] += 1
                    if 400 <= r.status < 500 and r.status not in (404, 408, 409, 429):
                        raise RuntimeError(f"{method} {path}: HTTP {r.status}: {data[:200]!r}")
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                self.errors[type(exc).__name__] += 1
            if time.monotonic() > deadline:
                raise TimeoutError(f"{method} {path} did not succeed within its bound")
            await asyncio.sleep(0.5)

    async def run(self, n: int, done_by: float) -> None:
        import aiohttp

        content, _ = batch_lines(n, self.seed)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
            try:
                deadline = time.monotonic() + 120
                form = aiohttp.FormData()
                form.add_field("purpose", "batch")
                form.add_field("file", content, filename="chaos.jsonl", content_type="application/jsonl")
                file_obj = json.loads(await self._call(session, "POST", "/v1/files", deadline, data=form))
                batch = await self._create(session, file_obj["id"], deadline)
                self.result = {"id": batch["id"], "status": batch["status"]}
                while batch["status"] not in ("completed", "failed", "expired", "cancelled"):
                    if time.monotonic() > done_by:
                        break
                    await asyncio.sleep(1.0)
                    batch = json.loads(await self._call(session, "GET", f"/v1/batches/{batch['id']}", done_by + 30))
                self.result.update(status=batch["status"], request_counts=batch.get("request_counts"))
                for key, field_name in (("output_ids", "output_file_id"), ("error_ids", "error_file_id")):
                    file_id = batch.get(field_name)
                    ids: list[str] = []
                    if file_id:
                        text = await self._call(session, "GET", f"/v1/files/{file_id}/content", time.monotonic() + 60)
                        ids = [json.loads(line)["custom_id"] for line in text.decode().splitlines() if line.strip()]
                    self.result[key] = ids
                self.result["output_lines"] = len(self.result["output_ids"])
                self.result["error_lines"] = len(self.result["error_ids"])
            except (RuntimeError, TimeoutError, ValueError, KeyError) as exc:
                self.result = {**(self.result or {}), "status": (self.result or {}).get("status", "not_submitted")}
                self.result["error"] = f"{type(exc).__name__}: {exc}"[:300]
        if self.result is not None:
            self.result["client_errors"] = dict(self.errors)

    async def _create(self, session, file_id: str, deadline: float) -> dict:
        import aiohttp

        body = {
            "input_file_id": file_id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            "metadata": {"chaos": self.tag},
        }
        while True:
            try:
                async with session.post(self.stack.http_url + "/v1/batches", json=body) as r:
                    data = await r.read()
                    if r.status == 200:
                        return json.loads(data)
                    self.errors[f"http_{r.status}"] += 1
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                self.errors[type(exc).__name__] += 1
            # The answer may be lost with the batch made: look for it by its tag before creating another.
            try:
                listed = json.loads(await self._call(session, "GET", "/v1/batches?limit=100", deadline))
                for batch in listed.get("data", ()):
                    if (batch.get("metadata") or {}).get("chaos") == self.tag:
                        return batch
            except (TimeoutError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("POST /v1/batches did not succeed within its bound")
            await asyncio.sleep(0.5)


# ------------------------------------------------------------------------------------- one seed


def run_seed(config: ChaosConfig, seed: int, *, quick: bool, keep_logs: bool = False) -> dict:
    from services.launcher.supervisor import StartupError

    state_dir = Path(tempfile.mkdtemp(prefix=f"bandmaster-chaos-{seed}-"))
    started = time.monotonic()
    for attempt in range(3):
        # A port taken between its choice and its bind fails the start: start again on other ports.
        stack = Stack(config, state_dir)
        try:
            stack.start()
            break
        except (StartupError, RuntimeError) as exc:
            stack.stop()
            if attempt == 2:
                raise
            _log(f"bench.chaos: seed {seed}: the stack did not start ({str(exc).splitlines()[0]}); again")
    try:
        schedule = fault_schedule(
            seed,
            config.duration_s,
            stack.instances(),
            first_s=config.first_fault_s,
            gap_s=config.fault_gap_s,
            freeze_s=config.freeze_s,
            down_s=config.down_s,
            count=config.faults,
            must=QUICK_MUST if quick else (),
            only=config.only,
        )
        _log(
            f"bench.chaos: seed {seed}: {config.programs} programs for {config.duration_s:g}s, "
            f"{len(schedule)} faults, a batch of {config.batch_requests}; {stack.describe}; logs in {state_dir}"
        )

        async def play():
            start = time.monotonic()
            injector = Injector(stack, schedule, config, start)
            watch = SchedulerWatch(stack, start)
            watching = asyncio.create_task(watch.run())
            load = Load(stack, injector, watch, config, seed, start)
            batch = BatchClient(stack, config, seed)
            tasks = [asyncio.create_task(load.run(config.duration_s))]
            # A limited schedule (--quick) runs to its end even into the drain; an unlimited one stops with the load.
            tasks.append(asyncio.create_task(injector.run(None if config.faults else config.duration_s)))
            if config.batch_requests:
                tasks.append(
                    asyncio.create_task(
                        batch.run(config.batch_requests, start + config.duration_s + config.batch_timeout_s)
                    )
                )
            progress = asyncio.create_task(_progress(load, injector, config))
            try:
                await asyncio.gather(*tasks)
            finally:
                progress.cancel()
                watching.cancel()
                await asyncio.gather(watching, return_exceptions=True)
                await stack.close_session()
            return injector, load, batch, watch

        from services.launcher.probes import busy_share, cpu_times

        cpu_before, load_before = cpu_times(), os.getloadavg()
        injector, load, batch, watch = asyncio.run(play())
        wall_s = time.monotonic() - started
        busy = busy_share(cpu_before, cpu_times())
        machine = {
            "cpus": os.cpu_count(),
            "cpu_busy": round(busy, 3) if busy is not None else None,
            "loadavg_1m_start": round(load_before[0], 2),
            "loadavg_1m_end": round(os.getloadavg()[0], 2),
        }
        _, expected = batch_lines(config.batch_requests, seed)
        report = build_report(
            config,
            seed,
            schedule,
            injector.records,
            load.programs,
            load.requests,
            batch.result,
            expected,
            stack.describe,
            wall_s,
            watch.outages,
        )
        report["batch_client"] = {"tag": batch.tag}
        report["machine"] = machine
    finally:
        stack.stop()
    report["state_dir"] = str(state_dir)
    if not report["violations"] and not keep_logs:
        shutil.rmtree(state_dir, ignore_errors=True)
        report["state_dir"] = None
    else:
        _log(f"bench.chaos: seed {seed}: {len(report['violations'])} violations; logs kept in {state_dir}")
    return report


async def _progress(load: Load, injector: Injector, config: ChaosConfig) -> None:
    every_s = max(5.0, min(60.0, config.duration_s / 10))
    while True:
        await asyncio.sleep(every_s)
        ok = sum(1 for r in load.requests if r.turn >= 0 and r.outcome == "ok")
        failed = sum(1 for r in load.requests if r.turn >= 0 and r.outcome != "ok")
        _log(
            f"bench.chaos: t={load.now():.0f}s running={load.running} turns ok={ok} failed={failed} "
            f"faults={len(injector.records)}"
        )


def text_summary(report: dict) -> str:
    lines = []
    for run in report["runs"]:
        p, r = run["programs"], run["requests"]
        lines.append(
            f"seed {run['seed']}: {len(run['faults'])} faults; programs {p['started']} (finished {p['finished']}, "
            f"compared with the scheduler {p['programs_compared']}, fail-open turns excused "
            f"{p['turns_excused_fail_open']}, attempts cut by router faults "
            f"{p.get('attempts_cut_by_router_faults', 0)}); turns ok {r['turns_ok']} of {r['turn_attempts']} attempts "
            f"({r['outcomes']}); batch {run['batch'].get('status')} "
            f"({run['batch'].get('output_lines')} output, {run['batch'].get('error_lines')} error lines)"
        )
        m = run.get("machine", {})
        lines.append(
            f"  machine: {m.get('cpus')} cores, {m.get('cpu_busy')} busy, load {m.get('loadavg_1m_start')} -> "
            f"{m.get('loadavg_1m_end')}; scheduler outages {run['scheduler_outages']}"
        )
        for row in run["invariants"]:
            lines.append(f"  {row['status']} {row['name']}: {row['violations']} violations")
        for v in run["violations"][:20]:
            lines.append(f"  violation: {json.dumps(v)}")
        for key, entry in run["recovery"].items():
            answer, turn = entry["service_answering_s"], entry["next_ok_turn_s"]
            lines.append(
                f"  {key:20s} x{entry['faults']}: answering again {answer['max'] if answer else '-'} s max, "
                f"next ok turn {turn['max'] if turn else '-'} s max"
            )
    lines.append(f"total violations over seeds {report['seeds']}: {report['violations_total']}")
    return "\n".join(lines)


FLAGS = (
    ("duration_s", float),
    ("programs", int),
    ("workers", int),
    ("speedup", float),
    ("max_turns", int),
    ("batch_requests", int),
    ("faults", int),
    ("turn_timeout_s", float),
    ("retry_budget_s", float),
    ("drain_s", float),
    ("redis_persistence", str),
    ("trace", bool),
)
"""Flags that set a ChaosConfig field of the same name; `--only` (repeatable) sets `only`."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/chaos.json"))
    parser.add_argument("--seeds", default="0", help="comma-separated seeds, one run each (default 0)")
    parser.add_argument("--quick", action="store_true", help="short, a few faults, for the test suite")
    parser.add_argument("--keep-logs", action="store_true", help="keep the services' logs of a passing run too")
    add_config_flags(parser, FLAGS, FULL, QUICK)
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="KIND[/ACTION]",
        help="inject only these faults (repeatable), e.g. --only scheduler/freeze: one fault kind in isolation",
    )
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args, FLAGS, FULL, QUICK, **({"only": tuple(args.only)} if args.only else {}))
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        require(bool(seeds), "seeds", args.seeds, "at least one seed")
    except (ConfigError, ValueError) as exc:
        _log(f"bench.chaos: {exc}")
        return 2
    runs: list[dict] = []
    report: dict = {}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        runs.append(run_seed(config, seed, quick=args.quick, keep_logs=args.keep_logs))
        report = {
            "benchmark": "chaos",
            "quick": args.quick,
            "config": asdict(config),
            "seeds": seeds,
            "seeds_done": [r["seed"] for r in runs],
            "violations_total": sum(len(r["violations"]) for r in runs),
            "target": "0 invariant violations over every seed",
            "runs": runs,
            "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        args.out.write_text(json.dumps(report, indent=1) + "\n")  # after each seed: a crash keeps the others
    print(text_summary(report))
    print(f"wrote {args.out}")
    return 0 if report["violations_total"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
