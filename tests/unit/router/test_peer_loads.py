"""Router replica sync, pure: the peer table (merge, own id excluded, staleness) and the load it adds."""

import pytest

from services.router.core.load import ActiveLoad, ReplicaLoad
from services.router.core.peer_loads import PeerLoads, PeerReport
from services.router.core.types import Replica

A, B = Replica("a"), Replica("b")


def tracker(peers=None, **tracking):
    return ActiveLoad(block_size=4, track_output_blocks=False, request_expiry_s=300.0, peers=peers, **tracking)


def test_peer_reports_are_summed_per_replica_without_this_routers_own():
    peers = PeerLoads("me", ttl_s=1.0)
    peers.replace(
        [
            PeerReport("me", {A: ReplicaLoad(9, 900, 90)}),  # our own report, echoed back: never added
            PeerReport("r2", {A: ReplicaLoad(1, 10, 3), B: ReplicaLoad(2, 0, 5)}),
            PeerReport("r3", {A: ReplicaLoad(2, 20, 4)}),
        ],
        now=0.0,
    )
    assert peers.peers == 2
    assert peers.get(A) == ReplicaLoad(3, 30, 7)
    assert peers.get(B) == ReplicaLoad(2, 0, 5)
    assert peers.get(Replica("a", 1)) is None


def test_a_new_table_replaces_the_view():
    peers = PeerLoads("me", ttl_s=1.0)
    peers.replace([PeerReport("r2", {A: ReplicaLoad(1, 10, 3)})], now=0.0)
    peers.replace([PeerReport("r3", {B: ReplicaLoad(1, 0, 1)})], now=0.1)  # r2 dropped out of the table
    assert peers.get(A) is None and peers.get(B) == ReplicaLoad(1, 0, 1) and peers.peers == 1


def test_the_generation_moves_with_each_change_of_the_view_only():
    peers = PeerLoads("me", ttl_s=1.0)
    start = peers.generation
    peers.replace([PeerReport("r2", {A: ReplicaLoad(1, 10, 3)})], now=0.0)
    taken = peers.generation
    assert taken != start
    assert not peers.expire(0.5) and peers.generation == taken  # nothing changed
    assert peers.expire(1.0) and peers.generation != taken
    dropped = peers.generation
    assert not peers.expire(2.0) and peers.generation == dropped


@pytest.mark.parametrize("age_s, dropped", [(0.0, False), (0.99, False), (1.0, True), (5.0, True)])
def test_the_view_is_dropped_once_no_table_arrived_for_the_ttl(age_s, dropped):
    peers = PeerLoads("me", ttl_s=1.0)
    peers.replace([PeerReport("r2", {A: ReplicaLoad(1, 10, 3)})], now=10.0)
    assert peers.expire(10.0 + age_s) is dropped
    assert (peers.get(A) is None) is dropped
    assert peers.age_s(10.0 + age_s) == (None if dropped else pytest.approx(age_s))
    assert peers.expire(20.0) is (not dropped)  # a view already dropped is not dropped twice


def test_no_table_yet_expires_nothing():
    peers = PeerLoads("me", ttl_s=1.0)
    assert not peers.expire(1e9) and peers.age_s(0.0) is None and peers.peers == 0


@pytest.mark.parametrize("own_id, ttl_s", [("", 1.0), ("me", 0.0), ("me", -1.0)])
def test_invalid_peer_table_parameters_are_refused(own_id, ttl_s):
    with pytest.raises(ValueError):
        PeerLoads(own_id, ttl_s)


def test_potential_and_load_add_the_peers_load():
    peers = PeerLoads("me", ttl_s=1.0)
    load = tracker(peers)
    assert load.add_request("r1", A, [1, 2, 3], isl_tokens=14, cached_tokens=8, now=0.0)  # 6 prefill, 3 blocks
    assert load.potential(A, [1, 2, 7], isl_tokens=12, cached_tokens=8) == (6 + 4, 3 + 1)
    peers.replace([PeerReport("r2", {A: ReplicaLoad(2, 100, 20), B: ReplicaLoad(1, 50, 5)})], now=0.0)
    # Peers' blocks are added as counts: our prompt's shared blocks are deduplicated against ours only.
    assert load.potential(A, [1, 2, 7], isl_tokens=12, cached_tokens=8) == (6 + 4 + 100, 3 + 1 + 20)
    assert load.potential(B, [1, 2, 7], isl_tokens=12, cached_tokens=0) == (12 + 50, 3 + 5)
    assert load.load(A) == ReplicaLoad(3, 106, 23)
    assert load.load(B) == ReplicaLoad(1, 50, 5)
    # What this router reports is its own count only (no echo of the peers' load).
    assert load.own_loads() == {A: ReplicaLoad(1, 6, 3)}
    peers.expire(5.0)
    assert load.potential(A, [1, 2, 7], isl_tokens=12, cached_tokens=8) == (6 + 4, 3 + 1)


@pytest.mark.parametrize(
    "tracking, potential_b",
    [
        ({"track_active_blocks": False}, (4 + 50, 1)),
        ({"track_prefill_tokens": False}, (4, 1 + 5)),
    ],
)
def test_a_load_term_switched_off_ignores_the_peers_term_too(tracking, potential_b):
    peers = PeerLoads("me", ttl_s=1.0)
    peers.replace([PeerReport("r2", {B: ReplicaLoad(1, 50, 5)})], now=0.0)
    assert tracker(peers, **tracking).potential(B, [1], isl_tokens=4, cached_tokens=0) == potential_b


def test_without_peers_nothing_changes():
    load = tracker()
    load.add_request("r1", A, [1, 2, 3], isl_tokens=14, cached_tokens=8, now=0.0)
    assert load.load(A) == load.own_load(A) == ReplicaLoad(1, 6, 3)
