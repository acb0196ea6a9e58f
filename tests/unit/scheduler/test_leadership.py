"""The leadership state machine (core/leadership.py): acquire, renew, step down, from lease reads and a clock."""

from __future__ import annotations

import pytest

from services.common.settings.errors import ConfigError
from services.scheduler.core.leadership import Leadership, LeaseParams, LeaseRecord, Role, StepDown

P = LeaseParams(ttl_s=2.0, renew_s=0.4, poll_s=0.25, margin_s=0.5)
OTHER = LeaseRecord("other", 3, "10.0.0.2:50052")


def leader(at: float = 100.0, epoch: int = 4) -> Leadership:
    lead = Leadership(P, "me", "10.0.0.1:50052")
    lead.acquired(at, epoch)
    return lead


def test_a_standby_tries_at_once_then_every_poll_and_remembers_the_leader():
    lead = Leadership(P, "me", "a:1")
    assert lead.acquire_due(0.0) and not lead.is_leader(0.0) and lead.leader_address(0.0) == ""
    lead.observed(10.0, OTHER)
    assert lead.leader_address(10.0) == OTHER.address and lead.highest_epoch == 3
    assert not lead.acquire_due(10.2) and lead.acquire_due(10.25)
    assert not lead.renew_due(11.0)


def test_acquiring_leads_until_ttl_minus_margin_counted_from_when_the_call_was_sent():
    lead = leader(at=100.0)
    assert lead.role is Role.LEADER and lead.epoch == 4 and lead.leader_address(100.0) == "10.0.0.1:50052"
    assert lead.is_leader(101.49) and not lead.is_leader(101.5)  # 100 + 2.0 - 0.5
    assert not lead.renew_due(100.39) and lead.renew_due(100.4)


def test_a_renewal_extends_from_its_send_time_never_backwards():
    lead = leader(at=100.0)
    lead.renewed(100.4)
    assert lead.valid_until == pytest.approx(101.9)
    lead.renewed(100.1)  # a late answer of an older renewal
    assert lead.valid_until == pytest.approx(101.9)


@pytest.mark.parametrize(
    ("failed_at", "steps_down"),
    [(100.4, False), (101.2, False), (101.5, True), (105.0, True)],
)
def test_failed_renewals_step_down_only_at_the_local_deadline(failed_at, steps_down):
    lead = leader(at=100.0)
    transition = lead.attempt_failed(failed_at)
    assert (transition is not None) is steps_down
    assert lead.is_leader(failed_at) is (not steps_down)
    if steps_down:
        assert transition.step_down is StepDown.EXPIRED and transition.role is Role.STANDBY


def test_a_frozen_leader_is_not_the_leader_when_it_wakes_even_before_its_loop_runs():
    lead = leader(at=100.0)
    # SIGSTOPped for 10 s: nothing ran, yet every decision check says no.
    assert not lead.is_leader(110.0) and lead.leader_address(110.0) == ""
    transition = lead.expired(110.0)
    assert transition is not None and transition.step_down is StepDown.EXPIRED
    assert lead.acquire_due(110.25) and not lead.acquire_due(110.1)


def test_the_leader_steps_down_before_any_other_replica_can_take_the_lease():
    """The store expires the lease ttl after it *received* the renewal (>= the send time); the leader stops
    `margin` before that on its own clock."""
    lead = leader(at=100.0)
    sent, received_by_store = 100.4, 100.45
    lead.renewed(sent)
    store_expiry = received_by_store + P.ttl_s
    assert not lead.is_leader(store_expiry - P.margin_s + 0.05)
    assert lead.valid_until <= store_expiry - P.margin_s


@pytest.mark.parametrize("why", [StepDown.LOST, StepDown.FENCED])
def test_lost_or_fenced_steps_down_at_once(why):
    lead = leader(at=100.0)
    transition = lead.lost(100.5, OTHER if why is StepDown.LOST else None, why)
    assert transition is not None and transition.step_down is why and not lead.is_leader(100.5)
    if why is StepDown.LOST:
        assert lead.leader_address(100.5) == OTHER.address
    assert lead.lost(100.6, None) is None  # already a standby: nothing more to end


def test_release_ends_the_term_and_a_late_renewal_answer_does_not_revive_it():
    lead = leader(at=100.0)
    assert lead.released(100.2).step_down is StepDown.SHUTDOWN
    lead.renewed(100.1)
    assert not lead.is_leader(100.3) and lead.role is Role.STANDBY


def test_the_next_wakeup_is_the_earlier_of_the_renewal_and_the_deadline():
    lead = leader(at=100.0)
    assert lead.next_wakeup(100.0) == pytest.approx(100.4)
    lead.attempt_failed(101.3)  # retries within the lease, but wakes at the deadline at the latest
    assert lead.next_wakeup(101.3) == pytest.approx(101.5)


def test_highest_epoch_only_grows():
    lead = Leadership(P, "me", "a:1")
    lead.observed(0.0, LeaseRecord("x", 7, "x:1"))
    lead.observed(1.0, LeaseRecord("y", 2, "y:1"))
    assert lead.highest_epoch == 7


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"ttl_s": 0.0}, "leader_lease_seconds"),
        ({"poll_s": float("inf")}, "leader_poll_seconds"),
        ({"margin_s": 1.0}, "leader_margin_seconds"),
        ({"renew_s": 0.8}, "leader_renew_seconds"),
    ],
)
def test_invalid_lease_timing_names_the_rule(kwargs, field):
    with pytest.raises(ConfigError) as err:
        LeaseParams(**kwargs)
    assert err.value.field == field
