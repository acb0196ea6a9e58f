"""The worker registry: who is registered, what each poll said, and when a worker goes away.

Pure: the caller passes monotonic and wall time in. Every mutation returns the transitions it
caused (for INFO logs and metrics) and bumps `version` only when something externally visible
changed (see `WorkerState.visible`).

Rules:
* Lowering a worker's budget is immediate; raising it must hold (`confirm_increase_polls`):
  - a card that is rejected or contradicts the registrant's expected figures makes the worker
    UNHEALTHY at once (the card cannot be trusted), with the reason;
  - `unhealthy_after_failures` failed polls in a row make it UNHEALTHY; it is kept (visible, no
    budget) and polled on;
  - a new card with less budget (retention tokens over all ranks, or max_programs) and more of
    neither replaces the old one at once;
  - any other new card (more budget, or the same budget with other figures), and recovery from
    UNHEALTHY, is published only once the same accepted card has been seen on
    `confirm_increase_polls` consecutive polls. Until then the old card stays published and an
    UNHEALTHY worker says `unhealthy: recovering (k of N consecutive good polls)`.
  A worker alternating between two cards therefore settles on the smaller one and stays there,
  and one flapping between a good and a rejected card stays UNHEALTHY.
  A new worker's first card is published at once (there is nothing to flap from).
* A published card whose degradations (server arguments off, see `cards.degradations`) differ from
  the previous published card's, the first card included, is a `degraded` transition naming what
  is off and the flag that ends it; it is logged once per change, not once per poll.
* The state always reflects the latest poll: a failure clears an earlier rejection or mismatch
  (the reason becomes `unhealthy: polls failing (last: timeout)`), an answer clears the failure.
* An RPC-registered worker that is UNHEALTHY and whose polls have been failing for longer than
  `remove_unhealthy_after_seconds` (0 = never) is removed; the clock starts when it goes
  UNHEALTHY by failing, or when an UNHEALTHY worker that was answering stops answering. Flag
  and config-file workers are the operator's static inventory: they are never removed, only
  polled until they come back. A worker that answers but whose card is rejected (or contradicts
  its registration) is not removed while it answers: it is reachable, and its reason stays
  visible to operators.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from services.capacity.core.cards import RetentionSettings, card_retention_tokens
from services.capacity.core.errors import AlreadyExists
from services.capacity.core.state import (
    Card,
    CardRejection,
    Degradation,
    Expectation,
    Health,
    Load,
    Origin,
    PollFailureReason,
    WorkerState,
)
from services.common.settings.errors import ConfigError


@dataclass(frozen=True)
class RegistrySettings:
    unhealthy_after_failures: int = 3
    """Consecutive failed polls that make a worker UNHEALTHY."""
    remove_unhealthy_after_seconds: float = 300.0
    """How long an RPC-registered worker may stay UNHEALTHY (polls failing) before removal; 0 = never."""
    confirm_increase_polls: int = 2
    """Consecutive polls a budget raise (recovery, a larger card) must be seen on; 1 = at once."""

    def __post_init__(self) -> None:
        if isinstance(self.unhealthy_after_failures, bool) or self.unhealthy_after_failures < 1:
            raise ConfigError(
                "unhealthy_after_failures", self.unhealthy_after_failures, "unhealthy_after_failures >= 1"
            )
        if not self.remove_unhealthy_after_seconds >= 0:
            raise ConfigError(
                "remove_unhealthy_after_seconds",
                self.remove_unhealthy_after_seconds,
                "remove_unhealthy_after_seconds >= 0 (0 = never)",
            )
        if isinstance(self.confirm_increase_polls, bool) or self.confirm_increase_polls < 1:
            raise ConfigError(
                "confirm_increase_polls", self.confirm_increase_polls, "confirm_increase_polls >= 1 (1 = no damping)"
            )


class WorkerIdTaken(AlreadyExists):
    """The id is registered with another URL."""

    def __init__(self, worker_id: str, url: str) -> None:
        super().__init__(f"worker_id {worker_id!r} is already registered with url {url}")


class UrlTaken(AlreadyExists):
    """The URL is registered under another id (two ids for one server would count it twice)."""

    def __init__(self, url: str, worker_id: str) -> None:
        super().__init__(f"url {url} is already registered as worker_id {worker_id!r}")


class TransitionKind(enum.Enum):
    ADDED = "added"
    REMOVED = "removed"
    HEALTH = "health"
    CARD_CHANGED = "card_changed"
    CARD_REJECTED = "card_rejected"
    MISMATCH = "mismatch"
    CARD_HELD = "card_held"  # a budget raise seen, not yet for confirm_increase_polls polls (DEBUG)
    DEGRADED = "degraded"  # the published card's degradations changed (WARNING while any remain)


@dataclass(frozen=True)
class Transition:
    kind: TransitionKind
    worker_id: str
    old: str
    new: str
    why: str = ""

    def message(self) -> str:
        why = f" ({self.why})" if self.why else ""
        return f"worker {self.worker_id} {self.kind.value}: {self.old} -> {self.new}{why}"


@dataclass(frozen=True)
class PollOk:
    """The worker answered /server_info (and /health) with 200."""

    card: Card | CardRejection


@dataclass(frozen=True)
class PollFailed:
    reason: PollFailureReason
    detail: str = ""


PollResult = PollOk | PollFailed


def degradation_advice(degraded: tuple[Degradation, ...]) -> str:
    """What each degradation costs and the SGLang flag that ends it ("" when nothing is off)."""
    return "; ".join(f"{d.server_arg} is off, restart the worker with {d.flag}: {d.consequence}" for d in degraded)


_UNLIMITED_PROGRAMS = 2**63  # max_running_requests 0 = no limit = more than any figure


class Registry:
    def __init__(self, settings: RegistrySettings, retention: RetentionSettings = RetentionSettings()) -> None:
        self.settings = settings
        self.retention = retention
        self._workers: dict[str, WorkerState] = {}
        self._by_url: dict[str, str] = {}
        # Starts at 1 so that known_version 0 (the proto default) never matches a real snapshot.
        self.version = 1

    # --- reads ---

    def snapshot(self) -> tuple[WorkerState, ...]:
        return tuple(self._workers.values())

    def get(self, worker_id: str) -> WorkerState | None:
        return self._workers.get(worker_id)

    def __len__(self) -> int:
        return len(self._workers)

    def __contains__(self, worker_id: object) -> bool:
        return worker_id in self._workers

    # --- writes ---

    def _put(self, new: WorkerState, old: WorkerState | None) -> None:
        self._workers[new.worker_id] = new
        if old is None or old.visible() != new.visible():
            self.version += 1

    def add(
        self, worker_id: str, url: str, origin: Origin, now: float, expectation: Expectation = Expectation()
    ) -> tuple[WorkerState, list[Transition]]:
        """Register a worker. Idempotent for the same (id, url): the expectation is updated.

        Raises WorkerIdTaken / UrlTaken on a conflict.
        """
        existing = self._workers.get(worker_id)
        if existing is not None and existing.url != url:
            raise WorkerIdTaken(worker_id, existing.url)
        owner = self._by_url.get(url)
        if owner is not None and owner != worker_id:
            raise UrlTaken(url, owner)
        if existing is not None:
            if existing.expectation == expectation:
                return existing, []
            updated = self._rejudge(replace(existing, expectation=expectation))
            self._put(updated, existing)
            return updated, self._card_transitions(existing, updated)
        state = WorkerState(worker_id=worker_id, url=url, origin=origin, registered_at=now, expectation=expectation)
        self._by_url[url] = worker_id
        self._put(state, None)
        return state, [
            Transition(TransitionKind.ADDED, worker_id, "absent", state.health.value, f"{origin.value} {url}")
        ]

    def remove(self, worker_id: str, why: str = "deregistered") -> list[Transition]:
        state = self._workers.pop(worker_id, None)
        if state is None:
            return []
        self._by_url.pop(state.url, None)
        self.version += 1
        return [Transition(TransitionKind.REMOVED, worker_id, state.health.value, "absent", why)]

    def set_load(self, worker_id: str, load: Load) -> bool:
        state = self._workers.get(worker_id)
        if state is None:
            return False
        if state.load != load:
            self._put(replace(state, load=load), state)
        return True

    def apply_poll(self, worker_id: str, result: PollResult, now: float, now_wall: float) -> list[Transition]:
        """Fold one poll result into the worker's state. Unknown ids (removed mid-poll) are ignored."""
        old = self._workers.get(worker_id)
        if old is None:
            return []
        held: Transition | None = None
        if isinstance(result, PollOk):
            new, held = self._answered(old, result.card, now_wall)
        else:
            new = self._failed(old, result, now)
        if new.health is not Health.UNHEALTHY:
            new = replace(new, failing_since=None)
        self._put(new, old)
        transitions = self._card_transitions(old, new)
        if held is not None:
            transitions.append(held)
        return transitions

    def _failed(self, old: WorkerState, result: PollFailed, now: float) -> WorkerState:
        failures = old.consecutive_failures + 1
        # The latest outcome is this failure: an earlier rejection, mismatch or recovery no longer applies.
        new = replace(
            old,
            consecutive_failures=failures,
            last_failure=result.reason,
            last_failure_detail=result.detail,
            rejection=None,
            mismatch="",
            recovering="",
            candidate=None,
            candidate_polls=0,
        )
        if failures >= self.settings.unhealthy_after_failures:
            new = replace(new, health=Health.UNHEALTHY)
        if new.health is Health.UNHEALTHY and (old.health is not Health.UNHEALTHY or old.last_failure is None):
            new = replace(new, failing_since=now)  # the removal clock starts when it stops answering
        return new

    def _answered(
        self, old: WorkerState, outcome: Card | CardRejection, now_wall: float
    ) -> tuple[WorkerState, Transition | None]:
        base = replace(
            old,
            consecutive_failures=0,
            last_failure=None,
            last_failure_detail="",
            last_success_wall=now_wall,
            recovering="",
        )
        if isinstance(outcome, CardRejection):
            return replace(
                base, rejection=outcome, mismatch="", health=Health.UNHEALTHY, candidate=None, candidate_polls=0
            ), None
        mismatch = base.expectation.contradiction(outcome)
        if mismatch:
            return replace(
                base,
                card=outcome,
                rejection=None,
                mismatch=mismatch,
                health=Health.UNHEALTHY,
                candidate=None,
                candidate_polls=0,
            ), None
        base = replace(base, rejection=None, mismatch="")
        needed = self.settings.confirm_increase_polls
        polls = old.candidate_polls + 1 if old.candidate == outcome else 1
        if self._at_once(old, outcome) or polls >= needed:
            return replace(base, card=outcome, health=Health.HEALTHY, candidate=None, candidate_polls=0), None
        recovering = (
            ""
            if old.health is Health.HEALTHY
            else f"unhealthy: recovering ({polls} of {needed} consecutive good polls)"
        )
        held = Transition(
            TransitionKind.CARD_HELD,
            old.worker_id,
            old.card.describe() if old.health is Health.HEALTHY and old.card else old.health.value,
            outcome.describe(),
            f"{polls} of {needed} consecutive polls",
        )
        return replace(base, candidate=outcome, candidate_polls=polls, recovering=recovering), held

    def _at_once(self, old: WorkerState, card: Card) -> bool:
        """Publish this accepted card now? Yes for a first card, the same card, or a pure drop."""
        if old.health is Health.PENDING or self.settings.confirm_increase_polls <= 1:
            return True
        if old.health is not Health.HEALTHY or old.card is None:
            return False  # recovery raises the budget from nothing
        if card == old.card:
            return True
        new_tokens, new_programs = self._budget(card)
        old_tokens, old_programs = self._budget(old.card)
        return (
            new_tokens <= old_tokens
            and new_programs <= old_programs
            and (new_tokens < old_tokens or new_programs < old_programs)
        )

    def _budget(self, card: Card) -> tuple[int, int]:
        return card_retention_tokens(card, self.retention), card.max_running_requests or _UNLIMITED_PROGRAMS

    @staticmethod
    def _rejudge(state: WorkerState) -> WorkerState:
        """After the registrant changed its expectation: check the published card against it."""
        if state.card is None:
            return state
        mismatch = state.expectation.contradiction(state.card)
        if state.health is Health.HEALTHY and mismatch:
            return replace(state, mismatch=mismatch, health=Health.UNHEALTHY, candidate=None, candidate_polls=0)
        if state.mismatch:
            # UNHEALTHY only because of the old expectation: the card itself was accepted on the last poll.
            return replace(state, mismatch=mismatch, health=Health.UNHEALTHY if mismatch else Health.HEALTHY)
        return state

    @staticmethod
    def _card_transitions(old: WorkerState, new: WorkerState) -> list[Transition]:
        out: list[Transition] = []
        wid = new.worker_id
        if new.rejection is not None and new.rejection != old.rejection:
            out.append(
                Transition(
                    TransitionKind.CARD_REJECTED,
                    wid,
                    "accepted" if old.rejection is None else str(old.rejection),
                    str(new.rejection),
                    new.rejection.reason.value,
                )
            )
        if new.card is not None and old.card is not None and new.card != old.card:
            out.append(Transition(TransitionKind.CARD_CHANGED, wid, old.card.describe(), new.card.describe()))
        old_off = old.card.degraded if old.card is not None else ()
        new_off = new.card.degraded if new.card is not None else ()
        if new_off != old_off and new.card is not None:
            out.append(
                Transition(
                    TransitionKind.DEGRADED,
                    wid,
                    ",".join(d.value for d in old_off) or "none",
                    ",".join(d.value for d in new_off) or "none",
                    degradation_advice(new_off),
                )
            )
        if new.mismatch and new.mismatch != old.mismatch:
            out.append(Transition(TransitionKind.MISMATCH, wid, "consistent", new.mismatch))
        if new.health is not old.health:
            why = ""
            if new.health is Health.UNHEALTHY:
                if new.rejection is not None:
                    why = str(new.rejection)
                elif new.mismatch:
                    why = new.mismatch
                else:
                    last = new.last_failure.value if new.last_failure else "?"
                    why = (
                        f"{new.consecutive_failures} consecutive poll failures, last {last}: {new.last_failure_detail}"
                    )
            elif new.card is not None:
                why = new.card.describe()
            out.append(Transition(TransitionKind.HEALTH, wid, old.health.value, new.health.value, why))
        return out

    def expire(self, now: float) -> list[Transition]:
        """Remove RPC-registered workers whose polls have failed for too long."""
        limit = self.settings.remove_unhealthy_after_seconds
        if limit <= 0:
            return []
        doomed = [
            s.worker_id
            for s in self._workers.values()
            if s.origin is Origin.RPC
            and s.health is Health.UNHEALTHY
            and s.last_failure is not None
            and s.failing_since is not None
            and now - s.failing_since >= limit
        ]
        out: list[Transition] = []
        for wid in doomed:
            out += self.remove(wid, f"unhealthy for more than {limit:g}s")
        return out
