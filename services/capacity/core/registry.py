"""The worker registry: who is registered, what each poll said, and when a worker goes away.

Pure: the caller passes monotonic and wall time in. Every mutation returns the transitions it
caused (for INFO logs and metrics) and bumps `version` only when something externally visible
changed (see `WorkerState.visible`).

Rules:
* A successful poll makes a worker HEALTHY and resets its failure count, unless its card is
  rejected or contradicts the registrant's expected figures: then it is UNHEALTHY at once (the
  card cannot be trusted) and carries the reason.
* `unhealthy_after_failures` failed polls in a row make it UNHEALTHY; it is kept (visible, no
  budget) and polled on.
* An RPC-registered worker that has been UNHEALTHY because its polls fail for longer than
  `remove_unhealthy_after_seconds` (0 = never) is removed. Flag and config-file workers are the
  operator's static inventory: they are never removed, only polled until they come back.
  A worker that answers but whose card is rejected (or contradicts its registration) is not
  removed while it answers: it is reachable, and its reason stays visible to operators.
* A new card that differs from the old one (a restart with other settings) replaces it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from services.common.errors import ConfigError
from services.capacity.core.errors import AlreadyExists
from services.capacity.core.state import (
    Card,
    CardRejection,
    Expectation,
    Health,
    Load,
    Origin,
    PollFailureReason,
    WorkerState,
)


@dataclass(frozen=True)
class RegistrySettings:
    unhealthy_after_failures: int = 3
    """Consecutive failed polls that make a worker UNHEALTHY."""
    remove_unhealthy_after_seconds: float = 300.0
    """How long an RPC-registered worker may stay UNHEALTHY (polls failing) before removal; 0 = never."""

    def __post_init__(self) -> None:
        if isinstance(self.unhealthy_after_failures, bool) or self.unhealthy_after_failures < 1:
            raise ConfigError("unhealthy_after_failures", self.unhealthy_after_failures,
                              "unhealthy_after_failures >= 1")
        if not self.remove_unhealthy_after_seconds >= 0:
            raise ConfigError("remove_unhealthy_after_seconds", self.remove_unhealthy_after_seconds,
                              "remove_unhealthy_after_seconds >= 0 (0 = never)")


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


class Registry:
    def __init__(self, settings: RegistrySettings) -> None:
        self.settings = settings
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

    def add(self, worker_id: str, url: str, origin: Origin, now: float,
            expectation: Expectation = Expectation()) -> tuple[WorkerState, list[Transition]]:
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
            updated = self._judge(replace(existing, expectation=expectation))
            self._put(updated, existing)
            return updated, self._card_transitions(existing, updated)
        state = WorkerState(worker_id=worker_id, url=url, origin=origin, registered_at=now, expectation=expectation)
        self._by_url[url] = worker_id
        self._put(state, None)
        return state, [Transition(TransitionKind.ADDED, worker_id, "absent", state.health.value,
                                  f"{origin.value} {url}")]

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
        if isinstance(result, PollOk):
            if isinstance(result.card, CardRejection):
                new = replace(old, rejection=result.card, consecutive_failures=0, last_failure=None,
                              last_success_wall=now_wall, last_failure_detail="")
            else:
                new = replace(old, card=result.card, rejection=None, consecutive_failures=0, last_failure=None,
                              last_success_wall=now_wall, last_failure_detail="")
            new = self._judge(new)
        else:
            failures = old.consecutive_failures + 1
            new = replace(old, consecutive_failures=failures, last_failure=result.reason,
                          last_failure_detail=result.detail)
            if failures >= self.settings.unhealthy_after_failures:
                new = replace(new, health=Health.UNHEALTHY)
        if new.health is Health.UNHEALTHY and old.health is not Health.UNHEALTHY:
            new = replace(new, unhealthy_since=now)
        elif new.health is not Health.UNHEALTHY:
            new = replace(new, unhealthy_since=None)
        self._put(new, old)
        return self._card_transitions(old, new)

    def _judge(self, state: WorkerState) -> WorkerState:
        """Health and mismatch after a successful poll (or a changed expectation)."""
        if state.rejection is not None:
            return replace(state, health=Health.UNHEALTHY, mismatch="")
        if state.card is None:
            return state
        mismatch = state.expectation.contradiction(state.card)
        return replace(state, mismatch=mismatch, health=Health.UNHEALTHY if mismatch else Health.HEALTHY)

    @staticmethod
    def _card_transitions(old: WorkerState, new: WorkerState) -> list[Transition]:
        out: list[Transition] = []
        wid = new.worker_id
        if new.rejection is not None and new.rejection != old.rejection:
            out.append(Transition(TransitionKind.CARD_REJECTED, wid, "accepted" if old.rejection is None else
                                  str(old.rejection), str(new.rejection), new.rejection.reason.value))
        if new.card is not None and old.card is not None and new.card != old.card:
            out.append(Transition(TransitionKind.CARD_CHANGED, wid, old.card.describe(), new.card.describe()))
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
                    why = f"{new.consecutive_failures} consecutive poll failures, last {last}: {new.last_failure_detail}"
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
            s.worker_id for s in self._workers.values()
            if s.origin is Origin.RPC and s.health is Health.UNHEALTHY and s.last_failure is not None
            and s.unhealthy_since is not None and now - s.unhealthy_since >= limit
        ]
        out: list[Transition] = []
        for wid in doomed:
            out += self.remove(wid, f"unhealthy for more than {limit:g}s")
        return out
