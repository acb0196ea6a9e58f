"""Per-client program limits: cap, new-program rate, idle expiry, release; on an injected clock."""

from __future__ import annotations

import pytest

from services.common.settings.errors import ConfigError
from services.router.core.limits import ClientLimitParams, ClientLimits, LimitReason


def test_cap_refuses_new_programs_but_never_a_known_programs_next_turn():
    limits = ClientLimits(ClientLimitParams(max_programs=2, new_programs_per_s=0, program_idle_s=100))
    assert limits.admit("a", "p1", 0).allowed and limits.admit("a", "p2", 1).allowed
    v = limits.admit("a", "p3", 2)
    assert (v.allowed, v.reason) == (False, LimitReason.TOO_MANY_PROGRAMS)
    assert v.retry_after_s == pytest.approx(98)  # p1 (seen at 0) expires at 100
    assert limits.admit("a", "p1", 3).allowed  # a known program: always
    assert limits.admit("b", "p3", 3).allowed  # another client has its own cap
    limits.release("a", "p2")
    assert limits.admit("a", "p3", 4).allowed and limits.programs("a") == 2


def test_idle_programs_stop_counting():
    limits = ClientLimits(ClientLimitParams(max_programs=1, new_programs_per_s=0, program_idle_s=10))
    assert limits.admit("a", "p1", 0).allowed
    assert not limits.admit("a", "p2", 9).allowed
    assert limits.admit("a", "p1", 9).allowed  # a turn refreshes it
    assert not limits.admit("a", "p2", 18).allowed
    assert limits.admit("a", "p2", 19).allowed  # p1 idle since 9


def test_token_bucket_limits_the_rate_of_new_programs():
    limits = ClientLimits(ClientLimitParams(max_programs=0, new_programs_per_s=2, new_programs_burst=3))
    assert all(limits.admit("a", f"p{i}", 0).allowed for i in range(3))
    v = limits.admit("a", "p3", 0)
    assert (v.allowed, v.reason) == (False, LimitReason.NEW_PROGRAM_RATE) and v.retry_after_s == pytest.approx(0.5)
    assert limits.admit("a", "p0", 0).allowed  # known programs use no token
    assert not limits.admit("a", "p3", 0.25).allowed
    assert limits.admit("a", "p3", 0.5).allowed
    assert limits.admit("b", "q", 0.5).allowed  # per client


def test_sweep_forgets_idle_programs_and_idle_clients():
    limits = ClientLimits(
        ClientLimitParams(max_programs=5, new_programs_per_s=1, new_programs_burst=1, program_idle_s=10)
    )
    limits.admit("a", "p1", 0)
    limits.admit("b", "q1", 5)
    assert limits.sweep(10) == 1 and limits.clients == 1 and limits.programs("a") == 0
    assert limits.sweep(15) == 1 and limits.clients == 0


@pytest.mark.parametrize(
    "kwargs, rule",
    [
        ({"max_programs": -1}, "max_programs >= 0"),
        ({"new_programs_per_s": -1}, "new_programs_per_s >= 0"),
        ({"new_programs_burst": 0}, "new_programs_burst >= 1"),
        ({"program_idle_s": 0}, "program_idle_s > 0"),
    ],
)
def test_invalid_params_name_the_rule(kwargs, rule):
    with pytest.raises(ConfigError, match=rule):
        ClientLimitParams(**kwargs)


def test_a_program_ended_elsewhere_is_forgotten_for_every_client_that_holds_it():
    limits = ClientLimits(ClientLimitParams(max_programs=2, new_programs_per_s=0))
    assert limits.admit("alice", "p1", 0.0).allowed and limits.admit("bob", "p1", 0.0).allowed
    assert limits.admit("alice", "p2", 0.0).allowed
    assert not limits.admit("alice", "p3", 1.0).allowed  # at the cap
    assert limits.forget("p1") == 2 and limits.forget("p1") == 0
    assert limits.programs("alice") == 1 and limits.programs("bob") == 0
    assert limits.admit("alice", "p3", 2.0).allowed
