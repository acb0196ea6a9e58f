"""Open HTTP connections per client (core/limits.py ConnectionShares): the per-client cap, the global cap,
and the idle connection evicted to make room for another client; on an injected clock."""

from __future__ import annotations

import pytest

from services.common.settings.errors import ConfigError
from services.router.core.limits import ConnectionLimitParams, ConnectionRefusal, ConnectionShares


def shares(max_connections: int, per_client: int) -> ConnectionShares:
    return ConnectionShares(ConnectionLimitParams(max_connections, per_client))


def test_a_client_at_its_share_is_refused_while_another_is_admitted():
    s = shares(10, 3)
    assert all(s.open(("hog", i), "hog", 0).allowed for i in range(3))
    v = s.open(("hog", 3), "hog", 1)
    assert (v.allowed, v.refusal) == (False, ConnectionRefusal.CLIENT_CAP)
    assert s.open("other", "other", 1).allowed
    assert (s.total, s.held("hog"), s.held("other")) == (4, 3, 1)
    s.close(("hog", 0))
    assert s.open(("hog", 3), "hog", 2).allowed


def test_at_the_cap_the_biggest_holders_longest_idle_connection_makes_room():
    s = shares(4, 0)  # no per-client cap: only the eviction shares the port
    for i in range(4):
        s.open(("hog", i), "hog", float(i))
    s.busy(("hog", 0))  # in a request: never evicted
    v = s.open("a", "a", 10)
    assert v.allowed and v.evict == ("hog", 1)  # idle since 1, the longest of the idle ones
    assert (s.total, s.held("hog"), s.client_of(("hog", 1))) == (4, 3, None)
    s.close(("hog", 1))  # the shell's connection_lost afterwards: a no-op
    assert s.total == 4
    v = s.open("b", "b", 11)
    assert v.allowed and v.evict == ("hog", 2)


def test_at_the_cap_a_client_never_evicts_its_own_nor_an_equal():
    s = shares(4, 0)
    for i in range(4):
        s.open(("a", i), "a", 0)
    v = s.open(("a", 4), "a", 1)  # its share is the whole port
    assert (v.allowed, v.refusal) == (False, ConnectionRefusal.CLIENT_CAP)
    s.close(("a", 3))
    s.open("b", "b", 0)
    v = s.open(("a", 4), "a", 1)  # its own are never evicted, nor b's single one
    assert (v.allowed, v.refusal) == (False, ConnectionRefusal.FULL)
    s = shares(4, 0)
    for client in ("a", "a", "b", "b"):
        s.open((client, s.held(client)), client, 0)
    v = s.open("c", "c", 1)  # c (0) takes from a holder of 2
    assert v.allowed and v.evict in (("a", 0), ("b", 0))
    v = s.open("d", "d", 2)  # d (0) takes from the one still holding 2
    assert v.allowed and v.evict is not None
    v = s.open("e", "e", 3)  # everyone holds 1: nobody is beyond a newcomer's share
    assert (v.allowed, v.refusal) == (False, ConnectionRefusal.FULL)


def test_busy_connections_are_not_evicted_and_idle_again_after_the_request():
    s = shares(2, 0)
    s.open("h1", "hog", 0)
    s.open("h2", "hog", 0)
    s.busy("h1")
    s.busy("h2")
    assert s.open("x", "x", 1).refusal is ConnectionRefusal.FULL
    s.idle("h2", 5)
    assert s.open("x", "x", 6).evict == "h2"


def test_ties_between_holders_go_to_the_longest_idle_connection():
    s = shares(6, 0)
    for i in range(3):
        s.open(("a", i), "a", 10 + i)
        s.open(("b", i), "b", 5 + i)
    assert s.open("c", "c", 20).evict == ("b", 0)


def test_move_refiles_a_connection_under_its_token_within_that_identitys_share():
    s = shares(10, 2)
    s.open("c1", "addr:10.0.0.1", 0)
    s.open("c2", "addr:10.0.0.1", 0)
    s.busy("c1")
    assert s.move("c1", "token:t", 1) and s.client_of("c1") == "token:t"
    assert (s.held("addr:10.0.0.1"), s.held("token:t"), s.total) == (1, 1, 2)
    s.idle("c1", 2)
    assert s.move("c2", "token:t", 3)  # an idle connection stays idle where it goes
    s.open("c3", "addr:10.0.0.1", 4)
    assert not s.move("c3", "token:t", 5)  # token:t holds its share: c3 stays filed by its address
    assert s.client_of("c3") == "addr:10.0.0.1"
    assert s.move("c3", "addr:10.0.0.1", 6) and s.move("unknown", "token:t", 6)
    s.close("c1")
    s.close("c2")
    s.close("c3")
    assert (s.total, s.clients) == (0, 0)


def test_per_client_share_is_bounded_by_the_port_cap():
    assert ConnectionLimitParams(4, 0).per_client == 4
    assert ConnectionLimitParams(4, 1024).per_client == 4
    assert ConnectionLimitParams(2048, 16).per_client == 16


@pytest.mark.parametrize(
    "kwargs, rule",
    [({"max_connections": 0}, "max_connections >= 1"), ({"max_per_client": -1}, "max_per_client >= 0")],
)
def test_invalid_params_name_the_rule(kwargs, rule):
    with pytest.raises(ConfigError, match=rule):
        ConnectionLimitParams(**kwargs)
