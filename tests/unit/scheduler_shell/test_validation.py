"""Every count and string is validated at the edge, and a Complete without a ticket never changes the table."""

import asyncio

import grpc
import pytest

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from services.scheduler.adapters.proto import MAX_TOKENS

pytestmark = pytest.mark.timeout(30)
W = ("w1", 0)
INT64_MAX = 2**63 - 1


async def _invalid(call, request, field: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call(request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.value.details(), err.value.details()


@pytest.mark.parametrize("field", ["prompt_tokens", "completion_tokens", "cached_tokens"])
@pytest.mark.parametrize("value", [MAX_TOKENS + 1, INT64_MAX])
async def test_complete_counts_above_the_bound_are_invalid_and_change_nothing(h, field, value):
    await h.set_capacity({W: 10_000})
    await h.admit("p", "r1", 100)
    before = h.table()
    await _invalid(h.client.Complete, pb.CompleteRequest(session_id="p", request_id="r1", **{field: value}), field)
    assert h.table() == before
    await h.complete("p", "r1", 120, 30)  # the ticket is still there
    assert (await h.program("p")).token_total == 150


@pytest.mark.parametrize("value", [MAX_TOKENS + 1, INT64_MAX])
async def test_admit_estimate_above_the_bound_is_invalid(h, value):
    await _invalid(
        h.client.Admit,
        pb.AdmitRequest(session_id="p", request_id="r", estimated_prompt_tokens=value),
        "estimated_prompt_tokens",
    )
    assert h.core.programs() == ()


async def test_largest_valid_counts_keep_list_programs_working(h):
    """Two turns at the bound (the issue: two Completes of 2^63-1 broke ListPrograms)."""
    await h.set_capacity({W: 10_000})
    for i in range(2):
        await h.admit("p", f"r{i}", 1)
        await h.complete("p", f"r{i}", MAX_TOKENS, MAX_TOKENS, "w1", 0)
    h.tick()
    listing = await h.client.ListPrograms(pb.ListProgramsRequest())
    assert listing.programs[0].token_total == 2 * MAX_TOKENS
    stats = await h.client.GetStats(pb.GetStatsRequest())
    assert stats.programs_paused + stats.programs_active == 1


@pytest.mark.parametrize("value", [86_400.5, 1e300, float("inf")])
async def test_ttft_above_a_day_is_invalid(h, value):
    await _invalid(
        h.client.Complete, pb.CompleteRequest(session_id="p", request_id="r", ttft_seconds=value), "ttft_seconds"
    )


async def test_complete_for_an_unknown_request_id_is_ignored_and_counted(h):
    await h.set_capacity({W: 10_000})
    await h.admit("p", "r1", 100)
    await h.complete("p", "r1", 100, 20, "w1", 0)
    before = h.table()
    await h.complete("p", "never-admitted", 5_000, 5_000, "w1", 0)
    await h.complete("p", "r1", 7_000, 0, "w1", 0)  # a repeat
    assert h.table() == before and (await h.program("p")).token_total == 120
    stats = await h.client.GetStats(pb.GetStatsRequest())
    assert stats.completes_ignored_total == 2 and stats.tickets_in_flight == 0


async def test_complete_for_a_held_admission_is_ignored(h):
    """No turn of a held request has run: its Complete cannot be real and changes nothing."""
    await h.set_capacity({W: 1_000})
    await h.admit("big", "b1", 1, timeout=5)
    await h.complete("big", "b1", 900, 0, "w1", 0)
    call = asyncio.ensure_future(h.admit("new", "n1", 100))
    await h.held(1)
    before = h.table()
    await h.complete("new", "n1", 50, 0, "w1", 0)
    assert h.table() == before and h.runtime.held_count == 1
    call.cancel()
    await h.held(0)


async def test_complete_naming_another_program_is_invalid(h):
    await h.set_capacity({W: 10_000})
    await h.admit("p", "r1", 100)
    await h.admit("q", "r2", 100)
    before = h.table()
    await _invalid(
        h.client.Complete, pb.CompleteRequest(session_id="q", request_id="r1", prompt_tokens=9), "session_id"
    )
    await h.admit("", "pt", 10)
    await _invalid(h.client.Complete, pb.CompleteRequest(session_id="q", request_id="pt"), "session_id")
    assert h.table() == before


async def test_complete_of_a_released_and_recreated_program_does_not_touch_the_new_one(h):
    await h.set_capacity({W: 10_000})
    await h.admit("p", "old-turn", 100)
    await h.client.Release(pb.ReleaseRequest(session_id="p"))
    await h.admit("p", "new-turn", 300)
    await h.complete("p", "old-turn", 9_000, 0, "w1", 0)
    prog = await h.program("p")
    assert prog.status == pb.PROGRAM_STATUS_REASONING and prog.token_total == 300


@pytest.mark.parametrize(
    "method, request_msg, field",
    [
        ("Admit", pb.AdmitRequest(session_id="p", request_id="r" * 257), "request_id"),
        ("Admit", pb.AdmitRequest(session_id="p", request_id="r\x00"), "request_id"),
        ("Admit", pb.AdmitRequest(session_id="p", request_id="r\n1"), "request_id"),
        ("Admit", pb.AdmitRequest(session_id="p", request_id="r\x7f"), "request_id"),
        ("Admit", pb.AdmitRequest(session_id="p", request_id="r\u200b"), "request_id"),
        ("Admit", pb.AdmitRequest(session_id="p\x1b[31m", request_id="r"), "session_id"),
        ("Admit", pb.AdmitRequest(session_id="p", parent_session_id="q" * 300, request_id="r"), "parent_session_id"),
        ("Admit", pb.AdmitRequest(session_id="p", parent_session_id="q\x00", request_id="r"), "parent_session_id"),
        ("Complete", pb.CompleteRequest(session_id="p", request_id="r" * 257), "request_id"),
        ("Complete", pb.CompleteRequest(session_id="p", request_id="r\t"), "request_id"),
        ("Complete", pb.CompleteRequest(session_id="p\x00", request_id="r"), "session_id"),
        ("Complete", pb.CompleteRequest(session_id="p", request_id="r", worker_id="w\n"), "worker_id"),
        ("Complete", pb.CompleteRequest(session_id="p", request_id="r", worker_id="w" * 257), "worker_id"),
        ("Bind", pb.BindRequest(request_id="r\x00", worker_id="w"), "request_id"),
        ("Bind", pb.BindRequest(request_id="r", worker_id="w\x00"), "worker_id"),
        ("Release", pb.ReleaseRequest(session_id="p" * 257), "session_id"),
        ("GetProgram", pb.GetProgramRequest(session_id="p\x00"), "session_id"),
    ],
)
async def test_strings_are_bounded_and_printable(h, method, request_msg, field):
    await _invalid(getattr(h.client, method), request_msg, field)
    assert h.core.programs() == ()
