"""Ticket leases over gRPC: Admit says how long, RenewLeases extends, the tick ends lapsed turns."""

import grpc
import pytest
from prometheus_client import generate_latest

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from services.scheduler.servicer import MAX_RENEW_IDS

pytestmark = pytest.mark.timeout(30)
W = ("w1", 0)


async def renew(h, *ids: str) -> pb.RenewLeasesResponse:
    return await h.client.RenewLeases(pb.RenewLeasesRequest(request_ids=list(ids)))


async def test_admit_carries_the_lease_and_a_renewed_turn_outlives_it(make_harness):
    h = await make_harness(ticket_lease_seconds=20.0)
    await h.set_capacity({W: 10_000})
    resp = await h.admit("p", "r1", 100)
    assert resp.lease_ttl_seconds == 20.0
    passthrough = await h.admit("", "pt", 10)
    assert passthrough.lease_ttl_seconds == 20.0
    for _ in range(3):
        h.clock.advance(15.0)
        answer = await renew(h, "r1", "pt", "unknown")
        assert answer.renewed == 2 and list(answer.unknown_request_ids) == ["unknown"]
        assert answer.lease_ttl_seconds == 20.0
        h.tick()
    assert (await h.program("p")).status == pb.PROGRAM_STATUS_REASONING
    await h.complete("p", "r1", 300, 20, "w1", 0)
    prog = await h.program("p")
    assert prog.status == pb.PROGRAM_STATUS_ACTING and prog.token_total == 320


async def test_the_tick_ends_a_turn_nobody_renews_any_more(make_harness):
    h = await make_harness(ticket_lease_seconds=20.0)
    await h.set_capacity({W: 10_000})
    await h.admit("p", "r1", 100)
    await h.client.RenewLeases(pb.RenewLeasesRequest(delivered_request_ids=["r1"]))  # delivered, then died
    h.clock.advance(19.0)
    h.tick()
    assert (await h.program("p")).status == pb.PROGRAM_STATUS_REASONING
    h.clock.advance(1.0)
    h.tick()
    assert (await h.program("p")).status == pb.PROGRAM_STATUS_ACTING
    stats = await h.client.GetStats(pb.GetStatsRequest())
    assert stats.tickets_expired_total == 1 and stats.tickets_in_flight == 0
    assert list((await renew(h, "r1")).unknown_request_ids) == ["r1"]
    text = generate_latest(h.runtime.metrics.registry).decode()
    assert "bandmaster_scheduler_tickets_expired_total 1.0" in text
    assert "bandmaster_scheduler_tickets_in_flight 0.0" in text


async def test_a_turn_never_renewed_is_rolled_back_when_its_lease_lapses(make_harness):
    """No RenewLeases, Bind or Complete named it: its answer never reached a live router."""
    h = await make_harness(ticket_lease_seconds=20.0)
    await h.set_capacity({W: 10_000})
    await h.admit("p", "r1", 100)
    await h.complete("p", "r1", 300, 20, "w1", 0)
    before = await h.program("p")
    await h.admit("p", "r2", 900)
    h.clock.advance(20.0)
    h.tick()
    after = await h.program("p")
    assert (after.status, after.token_total, after.turns, after.worker_id) == (
        before.status,
        before.token_total,
        before.turns,
        before.worker_id,
    )
    stats = await h.client.GetStats(pb.GetStatsRequest())
    assert stats.tickets_expired_total == 1 and stats.tickets_in_flight == 0


async def test_no_lease_when_disabled(make_harness):
    h = await make_harness(ticket_lease_seconds=0.0)
    await h.set_capacity({W: 10_000})
    assert (await h.admit("p", "r1", 100)).lease_ttl_seconds == 0.0
    h.clock.advance(10_000.0)
    h.tick()
    assert (await h.program("p")).status == pb.PROGRAM_STATUS_REASONING
    assert (await renew(h, "r1")).lease_ttl_seconds == 0.0


@pytest.mark.parametrize(
    "ids, fragment",
    [
        (["ok", "bad\x00"], "request_ids[1]"),
        (["x" * 257], "request_ids[0]"),
        ([""], "request_ids[0] is required"),
        ([f"r{i}" for i in range(MAX_RENEW_IDS + 1)], f"at most {MAX_RENEW_IDS}"),
    ],
)
async def test_renew_validates_every_id(h, ids, fragment):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await renew(h, *ids)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and fragment in err.value.details()


async def test_a_full_batch_is_accepted(h):
    answer = await renew(h, *[f"r{i}" for i in range(MAX_RENEW_IDS)])
    assert answer.renewed == 0 and len(answer.unknown_request_ids) == MAX_RENEW_IDS


async def test_a_bound_and_renewed_turn_never_delivered_is_rolled_back(make_harness):
    """Issue 21: a router killed between Bind and its 200. Bind and renewals confirm nothing: the client got
    no byte and retries the turn, so the lapsed ticket is rolled back (the turns stay the client's)."""
    h = await make_harness(ticket_lease_seconds=20.0)
    await h.set_capacity({W: 10_000})
    await h.admit("p", "r1", 100)
    await h.complete("p", "r1", 300, 20, "w1", 0)
    before = await h.program("p")
    await h.admit("p", "r2", 900)
    await h.client.Bind(pb.BindRequest(request_id="r2", worker_id="w1", dp_rank=0))
    await renew(h, "r2")  # a live router waiting on a slow worker
    h.clock.advance(20.0)
    h.tick()
    after = await h.program("p")
    assert (after.status, after.turns, after.token_total) == (before.status, before.turns, before.token_total)


async def test_a_delivered_turn_counts_when_its_lease_lapses(make_harness):
    h = await make_harness(ticket_lease_seconds=20.0)
    await h.set_capacity({W: 10_000})
    await h.admit("p", "r1", 100)
    answer = await h.client.RenewLeases(pb.RenewLeasesRequest(delivered_request_ids=["r1", "gone"]))
    assert answer.renewed == 1 and list(answer.unknown_request_ids) == ["gone"]
    h.clock.advance(20.0)
    h.tick()
    prog = await h.program("p")
    assert prog.status == pb.PROGRAM_STATUS_ACTING and prog.turns == 1


async def test_renew_validates_every_delivered_id(h):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await h.client.RenewLeases(pb.RenewLeasesRequest(delivered_request_ids=["ok", "bad\x00"]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "delivered_request_ids[1]" in err.value.details()
