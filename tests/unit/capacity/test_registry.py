"""Registry transitions with a FakeClock: health, removal, restarts, expectations, versioning."""

from dataclasses import FrozenInstanceError, replace

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
from services.common.settings.errors import ConfigError


def card(**overrides):
    info = {
        "max_total_num_tokens": 1000,
        "page_size": 1,
        "version": "v1",
        "enable_cache_report": True,
        "enable_priority_scheduling": True,
    }
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
    poll(reg, clock, "w", OK)  # recovery raises the budget: it must hold for 2 polls (the default)
    assert reg.get("w").health is Health.UNHEALTHY and reg.get("w").consecutive_failures == 0
    poll(reg, clock, "w", OK)
    assert reg.get("w").health is Health.HEALTHY


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
    assert reg.get("w").health is Health.UNHEALTHY and reg.get("w").rejection is None
    poll(reg, clock, "w", OK)
    assert reg.get("w").health is Health.HEALTHY


def test_restart_with_different_info_replaces_the_card(clock):
    reg = make(clock)
    reg.add("w", "http://h:1", Origin.RPC, clock.monotonic())
    poll(reg, clock, "w", OK)
    bigger = PollOk(card(max_total_num_tokens=2000, version="v2"))
    assert [t.kind for t in poll(reg, clock, "w", bigger)] == [TransitionKind.CARD_HELD]  # a raise: held once
    transitions = poll(reg, clock, "w", bigger)
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
    with pytest.raises(ConfigError, match="confirm_increase_polls >= 1"):
        RegistrySettings(confirm_increase_polls=0)


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
    with pytest.raises(FrozenInstanceError):
        replace(snap[0]).health = Health.HEALTHY  # frozen


# --- excluded_reason describes the latest outcome (issue 11) ---


def reason(reg, wid="w"):
    return next(
        w.excluded_reason for w in recompute(RetentionSettings(), reg.snapshot()).workers if w.state.worker_id == wid
    )


REJECTED = PollOk(card(max_total_num_tokens=0))


def test_excluded_reason_always_describes_the_latest_outcome(clock):
    reg = make(clock, unhealthy_after_failures=3)
    reg.add("w", "http://h:1", Origin.RPC, clock.monotonic())
    poll(reg, clock, "w", FAIL)
    assert reason(reg) == "pending: no successful poll yet (last: timeout)"
    poll(reg, clock, "w", OK)
    assert reason(reg) == ""
    poll(reg, clock, "w", REJECTED)
    assert reason(reg) == "server_info: max_total_num_tokens 0 is not a positive number"
    # Regression: after a timeout the reason still named the previous rejection.
    poll(reg, clock, "w", FAIL)
    assert reg.get("w").health is Health.UNHEALTHY
    assert reason(reg) == "unhealthy: polls failing (last: timeout)"
    poll(reg, clock, "w", PollFailed(PollFailureReason.CONNECTION, "refused"))
    assert reason(reg) == "unhealthy: polls failing (last: connection)"
    poll(reg, clock, "w", OK)
    assert reason(reg) == "unhealthy: recovering (1 of 2 consecutive good polls)"
    poll(reg, clock, "w", OK)
    assert reason(reg) == "" and reg.get("w").health is Health.HEALTHY


def test_a_mismatch_followed_by_a_timeout_reports_the_timeout(clock):
    reg = make(clock)
    reg.add("w", "http://h:1", Origin.RPC, clock.monotonic(), Expectation(gpu_kv_tokens=5000))
    poll(reg, clock, "w", OK)
    assert reason(reg).startswith("registration: expected_gpu_kv_tokens 5000")
    poll(reg, clock, "w", FAIL)
    assert reason(reg) == "unhealthy: polls failing (last: timeout)"
    poll(reg, clock, "w", OK)
    assert reason(reg).startswith("registration: expected_gpu_kv_tokens 5000")


def test_removal_clock_starts_when_an_answering_worker_stops_answering(clock):
    reg = make(clock, unhealthy_after_failures=1, remove_unhealthy_after_seconds=100)
    reg.add("w", "http://h:1", Origin.RPC, clock.monotonic())
    poll(reg, clock, "w", REJECTED)  # answering: never removed, however long
    clock.advance(1000)
    assert reg.expire(clock.monotonic()) == []
    poll(reg, clock, "w", FAIL)  # now it stops answering: 100 s from here
    assert reg.expire(clock.monotonic()) == []
    clock.advance(99)
    assert reg.expire(clock.monotonic()) == []
    clock.advance(1)
    assert [t.kind for t in reg.expire(clock.monotonic())] == [TransitionKind.REMOVED]


def test_reregistering_does_not_revive_a_worker_whose_polls_fail(clock):
    reg = make(clock, unhealthy_after_failures=1)
    reg.add("w", "http://h:1", Origin.RPC, clock.monotonic())
    poll(reg, clock, "w", OK)
    poll(reg, clock, "w", FAIL)
    reg.add("w", "http://h:1", Origin.RPC, clock.monotonic(), Expectation(page_size=1))
    assert reg.get("w").health is Health.UNHEALTHY


# --- damping: raises must persist, drops are immediate (issue 11) ---

SMALL = PollOk(card(max_total_num_tokens=1000))
BIG = PollOk(card(max_total_num_tokens=2000))


def healthy_with(reg, clock, first):
    reg.add("w", "http://h:1", Origin.RPC, clock.monotonic())
    poll(reg, clock, "w", first)
    assert reg.get("w").health is Health.HEALTHY


def test_a_worker_alternating_two_cards_does_not_flip_the_budget(clock):
    # Regression: the budget flipped on every poll, each flip logged at INFO.
    for first, second in ((SMALL, BIG), (BIG, SMALL)):
        reg = make(clock)
        healthy_with(reg, clock, first)
        changes = []
        for _ in range(10):
            changes += [
                t for r in (second, first) for t in poll(reg, clock, "w", r) if t.kind is TransitionKind.CARD_CHANGED
            ]
        # BIG first: one immediate drop to SMALL, and BIG never again holds for 2 polls. SMALL first: nothing.
        assert reg.get("w").card == SMALL.card
        assert len(changes) == (1 if first is BIG else 0)
        poll(reg, clock, "w", SMALL)
        version = reg.version
        for r in (BIG, SMALL) * 5:
            poll(reg, clock, "w", r)
        assert reg.version == version


def test_a_larger_card_is_adopted_after_confirm_increase_polls(clock):
    reg = make(clock, confirm_increase_polls=3)
    healthy_with(reg, clock, SMALL)
    version = reg.version
    (held,) = poll(reg, clock, "w", BIG)
    assert held.kind is TransitionKind.CARD_HELD and "1 of 3" in held.why
    poll(reg, clock, "w", BIG)
    assert reg.get("w").card == SMALL.card and reg.version == version  # held: nothing visible moved
    (changed,) = poll(reg, clock, "w", BIG)
    assert changed.kind is TransitionKind.CARD_CHANGED and reg.get("w").card == BIG.card


def test_an_interrupted_increase_starts_counting_again(clock):
    reg = make(clock, confirm_increase_polls=2)
    healthy_with(reg, clock, SMALL)
    for r in (BIG, SMALL, BIG, FAIL, BIG):
        poll(reg, clock, "w", r)
    assert reg.get("w").card == SMALL.card
    poll(reg, clock, "w", BIG)
    assert reg.get("w").card == BIG.card


def test_drops_rejections_and_failures_are_immediate(clock):
    reg = make(clock, confirm_increase_polls=5, unhealthy_after_failures=1)
    healthy_with(reg, clock, BIG)
    poll(reg, clock, "w", SMALL)
    assert reg.get("w").card == SMALL.card
    poll(reg, clock, "w", REJECTED)
    assert reg.get("w").health is Health.UNHEALTHY
    reg2 = make(clock, confirm_increase_polls=5, unhealthy_after_failures=1)
    healthy_with(reg2, clock, BIG)
    poll(reg2, clock, "w", FAIL)
    assert reg2.get("w").health is Health.UNHEALTHY


def test_a_card_flapping_with_a_rejection_stays_unhealthy(clock):
    reg = make(clock)
    healthy_with(reg, clock, SMALL)
    for _ in range(10):
        poll(reg, clock, "w", REJECTED)
        assert reg.get("w").health is Health.UNHEALTHY
        poll(reg, clock, "w", SMALL)
        assert reg.get("w").health is Health.UNHEALTHY


def test_fewer_max_programs_is_a_drop_and_metadata_changes_are_damped(clock):
    reg = make(clock)
    healthy_with(reg, clock, PollOk(card(max_running_requests=64)))
    poll(reg, clock, "w", PollOk(card(max_running_requests=32)))
    assert reg.get("w").card.max_running_requests == 32
    version = reg.version
    for v in ("v2", "v1") * 5:  # same budget, another version string
        poll(reg, clock, "w", PollOk(card(max_running_requests=32, version=v)))
    assert reg.version == version
    # More programs but a smaller budget: neither a pure drop nor a pure raise -> held.
    poll(reg, clock, "w", PollOk(card(max_running_requests=64, max_total_num_tokens=500)))
    assert reg.get("w").card.max_running_requests == 32


def test_a_drop_is_judged_by_the_capped_budget_when_the_cap_is_on(clock):
    # Uncapped 1000 + 3000 = 4000 > 3000, capped 1000 + 1000 = 2000 < 3000: with the cap, a drop.
    host = dict(enable_hierarchical_cache=True, hicache_write_policy="write_back", hicache_host_total_tokens=3000)
    reg = Registry(RegistrySettings(), RetentionSettings(cap_host_at_gpu=True))
    healthy_with(reg, clock, PollOk(card(max_total_num_tokens=3000)))
    poll(reg, clock, "w", PollOk(card(max_total_num_tokens=1000, **host)))
    assert reg.get("w").card.host_kv_tokens == 3000


def test_confirm_increase_polls_1_adopts_everything_at_once(clock):
    reg = make(clock, confirm_increase_polls=1, unhealthy_after_failures=1)
    healthy_with(reg, clock, SMALL)
    poll(reg, clock, "w", BIG)
    assert reg.get("w").card == BIG.card
    poll(reg, clock, "w", FAIL)
    poll(reg, clock, "w", BIG)
    assert reg.get("w").health is Health.HEALTHY


def test_a_new_worker_is_healthy_on_its_first_card(clock):
    reg = make(clock, confirm_increase_polls=5)
    healthy_with(reg, clock, BIG)


def test_a_degraded_card_is_one_transition_per_change_naming_the_flag(clock):
    reg = make(clock)
    reg.add("w", "http://h:1", Origin.RPC, clock.monotonic())
    bare = PollOk(card(enable_cache_report=False))
    first = [t for t in poll(reg, clock, "w", bare) if t.kind is TransitionKind.DEGRADED]
    assert [(t.old, t.new) for t in first] == [("none", "cache_report_off")]
    assert "restart the worker with --enable-cache-report" in first[0].why
    # The same card again: nothing new to say, however many polls.
    for _ in range(3):
        assert not [t for t in poll(reg, clock, "w", bare) if t.kind is TransitionKind.DEGRADED]
    assert reg.get("w").health is Health.HEALTHY  # degraded, never unhealthy: the budget is whole
    # Restarted with the flag: the same budget with other figures is held for confirm_increase_polls (2) polls.
    assert not [t for t in poll(reg, clock, "w", OK) if t.kind is TransitionKind.DEGRADED]
    fixed = [t for t in poll(reg, clock, "w", OK) if t.kind is TransitionKind.DEGRADED]
    assert [(t.old, t.new, t.why) for t in fixed] == [("cache_report_off", "none", "")]


def test_a_first_card_with_nothing_off_says_nothing_about_degradation(clock):
    reg = make(clock)
    reg.add("w", "http://h:1", Origin.RPC, clock.monotonic())
    assert TransitionKind.DEGRADED not in {t.kind for t in poll(reg, clock, "w", OK)}
