"""Reference acceptance items (thunderagent.md §6) that concern the service edge, over gRPC."""

import asyncio

import grpc
import pytest

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from tests.support.eventually import assert_eventually
from tests.unit.scheduler_shell.test_servicer import fill

pytestmark = pytest.mark.timeout(30)


async def test_status_reports_programs_and_replica_utilisation(h):
    """§6 #3: the "1:0" row shows capacity 1000 and used 225; p1 on worker 1, p2 on worker 2."""
    await h.set_capacity({("1", 0): 1000, ("2", 0): 1000})
    assert (await h.admit("p1", "a", 100)).worker_id in ("1", "2")
    first = (await h.program("p1")).worker_id
    await h.complete("p1", "a", 100, 25, first, 0)
    second = (await h.admit("p2", "b", 100)).worker_id
    assert {first, second} == {"1", "2"}
    listing = await h.client.ListPrograms(pb.ListProgramsRequest())
    row = next(r for r in listing.replicas if r.worker_id == first)
    assert (row.retention_tokens, row.used_tokens, row.active_programs, row.resident_programs) == (1000, 225, 0, 1)
    stats = await h.client.GetStats(pb.GetStatsRequest())
    assert (stats.programs_active, stats.programs_reasoning, stats.programs_acting) == (2, 1, 1)


async def test_back_fill_records_the_replica_the_engine_chose(h):
    """§6 #6: cold start, then Bind (7, 2); the next turn is pinned there."""
    assert not (await h.admit("p", "t1", 50)).pinned
    await h.set_capacity({("7", 2): 10_000, ("8", 0): 10_000})
    assert (await h.client.Bind(pb.BindRequest(request_id="t1", worker_id="7", dp_rank=2))).bound
    await h.complete("p", "t1", 50, 5, "7", 2)
    resp = await h.admit("p", "t2", 60)
    assert resp.pinned and (resp.worker_id, resp.dp_rank) == ("7", 2)


async def test_back_fill_from_a_superseded_turn_is_ignored(h):
    """§6 #8: a Bind for an older turn does not overwrite the later turn's reservation."""
    await h.admit("p", "t1", 50)
    await h.admit("p", "t2", 50)
    await h.set_capacity({("7", 2): 10_000})
    assert not (await h.client.Bind(pb.BindRequest(request_id="t1", worker_id="7", dp_rank=2))).bound
    assert (await h.client.Bind(pb.BindRequest(request_id="t2", worker_id="7", dp_rank=2))).bound


async def test_back_fill_does_not_override_an_admission_placement(h):
    """§6 #9."""
    await h.set_capacity({("1", 0): 10_000, ("2", 3): 10})
    resp = await h.admit("p", "t1", 50)
    assert (resp.worker_id, resp.dp_rank) == ("1", 0)
    assert not (await h.client.Bind(pb.BindRequest(request_id="t1", worker_id="2", dp_rank=3))).bound
    assert (await h.program("p")).worker_id == "1"


async def test_paused_program_holds_the_call_until_resume_with_boost(make_harness):
    """§6 #12: the turn waits until a tick resumes the program, then goes pinned with +boost."""
    h = await make_harness(pause_target=0.92)
    await h.set_capacity({("1", 0): 10_000})
    await fill(h, 9_000, "a", worker="1")
    await fill(h, 800, "p", worker="1")
    h.tick()
    call = asyncio.ensure_future(h.admit("p", "t2", 800))
    await h.held(1)
    h.tick()
    assert not call.done()  # still no room
    await h.client.Release(pb.ReleaseRequest(session_id="a"))
    h.tick()
    resp = await call
    assert resp.was_paused and (resp.worker_id, resp.dp_rank) == ("1", 0) and resp.priority == 1
    assert resp.priority_seconds == pytest.approx(1.0)


async def test_soft_demote_band_lowers_the_next_turns_priority(h):
    """§6 #16: util in [0.80, 0.95) -> the next turn gets -2 and was_soft_demoted."""
    await h.set_capacity({("1", 0): 1_000})
    await fill(h, 780, "p", worker="1")  # 880 / 1000
    h.tick()
    resp = await h.admit("p", "t2", 0)
    assert resp.was_soft_demoted and resp.priority == -2 and resp.priority_seconds == pytest.approx(-2.0)


async def test_idle_program_expires_on_the_injected_clock(make_harness):
    """§6 #29: an ACTING program idle past the TTL is released by a tick; its budget is freed."""
    h = await make_harness(program_idle_ttl_seconds=5.0)
    await h.set_capacity({("1", 0): 1_000})
    await fill(h, 300, "p", worker="1")
    h.clock.advance(4.0)
    h.tick()
    assert (await h.program("p")).status == pb.PROGRAM_STATUS_ACTING
    h.clock.advance(2.0)
    h.tick()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await h.program("p")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    stats = await h.client.GetStats(pb.GetStatsRequest())
    assert stats.expired_total == 1 and stats.replicas[0].used_tokens == 0


async def test_a_second_turn_waits_behind_a_held_one_and_a_cancel_does_not_strand_it(h):
    """§6 #36 / §3.9: another turn of a parked program waits on the program's gate; cancelling the first
    rolls it back and the second proceeds (queued again, then resumed)."""
    await h.set_capacity({("1", 0): 1_000})
    await fill(h, 900, "big", worker="1")
    first = asyncio.ensure_future(h.admit("new", "n1", 100))
    await h.held(1)
    second = asyncio.ensure_future(h.admit("new", "n2", 100))
    await assert_eventually(lambda: h.runtime.gate_waiting == 1, timeout_s=5)  # arrived, and not admitted
    assert h.core.program("new").turns == 1 and h.runtime.gated("new")
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await h.held(1)  # the second is now the held one, on a re-created program
    assert h.core.program("new").turns == 1
    await h.client.Release(pb.ReleaseRequest(session_id="big"))
    h.tick()
    resp = await second
    assert resp.was_paused and resp.pinned and resp.worker_id == "1"


async def test_two_cancelled_admissions_of_a_new_program_leave_no_trace(h):
    """§6 #38, in either cancellation order."""
    await h.set_capacity({("1", 0): 1_000})
    await fill(h, 900, "big", worker="1")
    before = h.table()
    for order in ((0, 1), (1, 0)):
        calls = [asyncio.ensure_future(h.admit("new", f"n{order}{i}", 100)) for i in range(2)]
        await h.held(1)
        await assert_eventually(lambda: h.runtime.gate_waiting == 1, timeout_s=5)
        for i in order:
            calls[i].cancel()
            with pytest.raises(asyncio.CancelledError):
                await calls[i]
        await h.held(0)
        assert h.table() == before
        assert not h.runtime.gated("new")
    h.core.ledger.check_invariants(h.clock.monotonic())


async def test_new_program_queues_before_its_first_turn_when_full_and_resumes_with_boost(h):
    """§6 #14."""
    await h.set_capacity({("1", 0): 1000})
    await fill(h, 850, "big", worker="1")  # 950 used
    call = asyncio.ensure_future(h.admit("new", "n1", 100))
    await h.held(1)
    prog = await h.program("new")
    assert prog.lifecycle == pb.LIFECYCLE_PAUSED and prog.paused_since.seconds > 0
    await h.client.Release(pb.ReleaseRequest(session_id="big"))
    h.tick()
    resp = await call
    assert resp.was_paused and resp.priority == 1
