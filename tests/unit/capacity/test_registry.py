"""Registry transitions with a FakeClock: health, removal, restarts, expectations, versioning."""

from dataclasses import replace

import pytest

from services.capacity.core.cards import RetentionSettings, derive_card, recompute
from services.capacity.core.registry import (
    PollFailed,
    PollOk,
    Registry,
    RegistrySettings,
    TransitionKind,
    UrlTaken,
    WorkerIdTaken,
)
from services.capacity.core.state import Expectation, Health, Load, Origin, PollFailureReason
from services.common.clock import FakeClock
from services.common.errors import ConfigError


def card(**overrides):
    info = {"max_total_num_tokens": 1000, "page_size": 1, "version": "v1"}
    info.update(overrides)
    return derive_card(info)


OK = PollOk(card())
FAIL = PollFailed(PollFailureReason.TIMEOUT, "no answer")


@pytest.fixture
def clock():
    return FakeClock(start=100.0)


def make(clock, **settings):
    return Registry(RegistrySettings(**settings))


def poll(reg, clock, wid, result):
    return reg.apply_poll(wid, result, clock.monotonic(), clock.wall())


def test_new_worker_is_pending_then_healthy(clock):
    reg = make(clock)
    state, transitions = reg.add("w", "http://h:1", Origin.RPC, clock.monotonic())
    assert state.health is Health.PENDING
    assert [t.kind for t in transitions] == [TransitionKind.ADDED]
    t = poll(reg, clock, "w", OK)
    assert reg.get("w").health is Health.HEALTHY
    assert [(x.kind, x.old, x.new) for x in t] == [(TransitionKind.HEALTH, "PENDING", "HEALTHY")]
    assert reg.get("w").last_success_wall == clock.wall()


def test_n_consecutive_failures_make_unhealthy_and_success_recovers(clock):
    reg = make(clock, unhealthy_after_failures=3)
    reg.add("w", "http://h:1", Origin.FLAG, clock.monotonic())
    poll(reg, clock, "w", OK)
    poll(reg, clock, "w", FAIL)
    poll(reg, clock, "w", FAIL)
    assert reg.get("w").health is Health.HEALTHY and reg.get("w").consecutive_failures == 2
    transitions = poll(reg, clock, "w", FAIL)
    assert reg.get("w").health is Health.UNHEALTHY
    assert transitions[0].kind is TransitionKind.HEALTH and "3 consecutive poll failures" in transitions[0].why
    # Kept, budget excluded.
    view = recompute(RetentionSettings(), reg.snapshot())
    assert view.total_retention_tokens == 0 and "unhealthy" in view.workers[0].excluded_reason
    poll(reg, clock, "w", OK)
    assert reg.get("w").health is Health.HEALTHY and reg.get("w").consecutive_failures == 0


def test_a_success_in_between_resets_the_count(clock):
    reg = make(clock, unhealthy_after_failures=2)
    reg.add("w", "http://h:1", Origin.RPC, clock.monotonic())
    for result in (FAIL, OK, FAIL, OK, FAIL):
        poll(reg, clock, "w", result)
    assert reg.get("w").health is Health.HEALTHY


def test_rpc_worker_removed_after_unhealthy_too_long(clock):
    reg = make(clock, unhealthy_after_failures=1, remove_unhealthy_after_seconds=300)
    reg.add("w", "http://h:1", Origin.RPC, clock.monotonic())
    poll(reg, clock, "w", FAIL)
    clock.advance(299)
    poll(reg, clock, "w", FAIL)
    assert reg.expire(clock.monotonic()) == []
    clock.advance(1)
    (t,) = reg.expire(clock.monotonic())
    assert t.kind is TransitionKind.REMOVED and "w" not in reg


@pytest.mark.parametrize("origin", [Origin.FLAG, Origin.CONFIG_FILE])
def test_static_workers_are_never_removed(clock, origin):
    reg = make(clock, unhealthy_after_failures=1, remove_unhealthy_after_seconds=10)
    reg.add("w", "http://h:1", origin, clock.monotonic())
    poll(reg, clock, "w", FAIL)
    clock.advance(10_000)
    assert reg.expire(clock.monotonic()) == [] and reg.get("w").health is Health.UNHEALTHY


def test_removal_zero_means_never(clock):
    reg = make(clock, unhealthy_after_failures=1, remove_unhealthy_after_seconds=0)
    reg.add("w", "http://h:1", Origin.RPC, clock.monotonic())
    poll(reg, clock, "w", FAIL)
    clock.advance(1e6)
    assert reg.expire(clock.monotonic()) == []


def test_removal_timer_restarts_after_recovery(clock):
    reg = make(clock, unhealthy_after_failures=1, remove_unhealthy_after_seconds=100)
    reg.add("w", "http://h:1", Origin.RPC, clock.monotonic())
    poll(reg, clock, "w", FAIL)
    clock.advance(90)
    poll(reg, clock, "w", OK)
    poll(reg, clock, "w", FAIL)
    clock.advance(90)
    assert reg.expire(clock.monotonic()) == []


def test_answering_worker_with_rejected_card_is_unhealthy_but_kept(clock):
    reg = make(clock, remove_unhealthy_after_seconds=1)
    reg.add("w", "http://h:1", Origin.RPC, clock.monotonic())
    poll(reg, clock, "w", OK)
    transitions = poll(reg, clock, "w", PollOk(card(max_total_num_tokens=0)))
    kinds = [t.kind for t in transitions]
    assert TransitionKind.CARD_REJECTED in kinds and TransitionKind.HEALTH in kinds
    assert reg.get("w").health is Health.UNHEALTHY
    clock.advance(100)
    assert reg.expire(clock.monotonic()) == []
    view = recompute(RetentionSettings(), reg.snapshot())
    assert view.workers[0].excluded_reason.startswith("server_info: max_total_num_tokens 0")
    poll(reg, clock, "w", OK)
    assert reg.get("w").health is Health.HEALTHY and reg.get("w").rejection is None


def test_restart_with_different_info_replaces_the_card(clock):
    reg = make(clock)
    reg.add("w", "http://h:1", Origin.RPC, clock.monotonic())
    poll(reg, clock, "w", OK)
    transitions = poll(reg, clock, "w", PollOk(card(max_total_num_tokens=2000, version="v2")))
    (t,) = transitions
    assert t.kind is TransitionKind.CARD_CHANGED
    assert "gpu_kv_tokens=1000" in t.old and "gpu_kv_tokens=2000" in t.new
    assert " -> " in t.message()
    assert reg.get("w").card.gpu_kv_tokens == 2000


def test_registration_expectation_contradicted_excludes_worker(clock):
    reg = make(clock)
    reg.add("w", "http://h:1", Origin.RPC, clock.monotonic(), Expectation(gpu_kv_tokens=5000))
    transitions = poll(reg, clock, "w", OK)
    assert TransitionKind.MISMATCH in [t.kind for t in transitions]
    state = reg.get("w")
    assert state.health is Health.UNHEALTHY
    view = recompute(RetentionSettings(), reg.snapshot())
    assert view.workers[0].excluded_reason == "registration: expected_gpu_kv_tokens 5000 != polled 1000"
    assert view.total_retention_tokens == 0
    # Re-registering with consistent figures clears it.
    reg.add("w", "http://h:1", Origin.RPC, clock.monotonic(), Expectation(gpu_kv_tokens=1000, page_size=1))
    assert reg.get("w").health is Health.HEALTHY and not reg.get("w").mismatch


def test_expected_page_size_mismatch(clock):
    reg = make(clock)
    reg.add("w", "http://h:1", Origin.RPC, clock.monotonic(), Expectation(page_size=16))
    poll(reg, clock, "w", OK)
    assert reg.get("w").mismatch == "registration: expected_page_size 16 != polled 1"


def test_add_is_idempotent_and_conflicts_are_typed(clock):
    reg = make(clock)
    reg.add("w", "http://h:1", Origin.RPC, clock.monotonic())
    version = reg.version
    state, transitions = reg.add("w", "http://h:1", Origin.RPC, clock.monotonic())
    assert transitions == [] and reg.version == version and len(reg) == 1
    with pytest.raises(WorkerIdTaken):
        reg.add("w", "http://other:1", Origin.RPC, clock.monotonic())
    with pytest.raises(UrlTaken):
        reg.add("w2", "http://h:1", Origin.RPC, clock.monotonic())


def test_remove(clock):
    reg = make(clock)
    reg.add("w", "http://h:1", Origin.RPC, clock.monotonic())
    assert [t.kind for t in reg.remove("w")] == [TransitionKind.REMOVED]
    assert reg.remove("w") == []
    reg.add("w2", "http://h:1", Origin.RPC, clock.monotonic())  # the URL is free again


def test_poll_for_removed_worker_is_ignored(clock):
    reg = make(clock)
    assert poll(reg, clock, "ghost", OK) == []


def test_version_moves_only_on_visible_change(clock):
    reg = make(clock, unhealthy_after_failures=3)
    v0 = reg.version
    reg.add("w", "http://h:1", Origin.RPC, clock.monotonic())
    v1 = reg.version
    assert v1 > v0
    poll(reg, clock, "w", OK)
    v2 = reg.version
    assert v2 > v1
    clock.advance(5)
    poll(reg, clock, "w", OK)  # same card, only last_success moves
    assert reg.version == v2
    poll(reg, clock, "w", FAIL)  # failure reason is visible
    v3 = reg.version
    assert v3 > v2
    poll(reg, clock, "w", FAIL)  # only the liveness counter moves
    assert reg.version == v3
    assert reg.set_load("w", Load(num_running_reqs=3))
    v4 = reg.version
    assert v4 > v3
    assert reg.set_load("w", Load(num_running_reqs=3))
    assert reg.version == v4
    assert not reg.set_load("nobody", Load())


def test_settings_validated():
    with pytest.raises(ConfigError, match="unhealthy_after_failures >= 1"):
        RegistrySettings(unhealthy_after_failures=0)
    with pytest.raises(ConfigError, match="remove_unhealthy_after_seconds >= 0"):
        RegistrySettings(remove_unhealthy_after_seconds=-1)


def test_pending_worker_that_never_answers_becomes_unhealthy(clock):
    reg = make(clock, unhealthy_after_failures=2)
    reg.add("w", "http://h:1", Origin.RPC, clock.monotonic())
    poll(reg, clock, "w", FAIL)
    assert reg.get("w").health is Health.PENDING
    poll(reg, clock, "w", FAIL)
    assert reg.get("w").health is Health.UNHEALTHY
    assert reg.get("w").card is None


def test_snapshot_is_immutable(clock):
    reg = make(clock)
    reg.add("w", "http://h:1", Origin.RPC, clock.monotonic())
    snap = reg.snapshot()
    poll(reg, clock, "w", OK)
    assert snap[0].health is Health.PENDING
    with pytest.raises(Exception):
        replace(snap[0]).health = Health.HEALTHY  # frozen
