"""Property-based fuzzing of every method of `bandmaster.scheduler.v1.Scheduler`, against a real in-process
scheduler on 127.0.0.1:0 (FakeClock, ticks by hand, a scripted capacity stream).

Each example is a fresh scheduler and a sequence of calls: Admit and AdmitStream (left running: they may be
held), Bind, Complete, RenewLeases, Release, GetProgram, ListPrograms, GetStats, GetRouterConfig, WatchEvents,
interleaved with capacity snapshots, ticks and clock moves. Ids come from a small pool (so calls meet the
same programs and tickets) or are odd strings (controls, surrogates, non-ASCII, 256-byte edges, long); counts
are at the int32/int64 edges; enums take unknown values; floats are NaN, infinite, negative; repeated fields
are empty or past their bound. Whatever is sent:

* every call ends OK or with a deliberate client-error status (never UNKNOWN or INTERNAL); a held Admit ends
  once its program is resumed (here: by a forced resume after the clock passed the resume timeout);
* afterwards the core's invariants hold, ListPrograms, GetStats and WatchEvents work, nothing was logged at
  ERROR (a failed tick or forced resume).

`make test` runs a few hundred examples (derandomized); `make test-slow` runs thousands.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from tests.fuzz.common import (
    CLIENT_ERRORS,
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    NORMAL,
    PROTO_TEXT,
    SLOW,
    LoopRig,
    floats_any,
    int_in,
)
from tests.unit.scheduler_shell.support import start_harness, workers_snapshot

RESUME_TIMEOUT_S = 1800.0
CALL_TIMEOUT_S = 10.0


def mostly(usual: st.SearchStrategy, odd: st.SearchStrategy) -> st.SearchStrategy:
    """`usual` four times in five (calls must meet the same programs and tickets), else `odd`."""
    return st.integers(0, 4).flatmap(lambda i: odd if i == 0 else usual)


SESSIONS = mostly(st.sampled_from(["p0", "p1", "p2", "", "child"]), st.one_of(st.just("p0 "), PROTO_TEXT))
REQUESTS = mostly(st.sampled_from(["r0", "r1", "r2", "r3", "r4"]), st.one_of(st.just(""), PROTO_TEXT))
WORKERS = mostly(st.sampled_from(["w1", "w2", "", "w9"]), PROTO_TEXT)
TOKENS = mostly(st.integers(0, 20_000), int_in(INT64_MIN, INT64_MAX))
RANKS = mostly(st.integers(0, 2), int_in(INT32_MIN, INT32_MAX))


# -- the calls ------------------------------------------------------------------------------------------


@dataclass
class Call:
    method: str
    request: object
    background: bool = False  # Admit/AdmitStream: may be held; awaited at the end


def admit_calls() -> st.SearchStrategy[Call]:
    request = st.builds(
        pb.AdmitRequest,
        session_id=SESSIONS,
        parent_session_id=SESSIONS,
        estimated_prompt_tokens=TOKENS,
        request_id=REQUESTS,
    )
    return st.builds(
        lambda method, r: Call(method, r, background=True), st.sampled_from(["Admit", "AdmitStream"]), request
    )


ADMITS = admit_calls()


OUTCOMES = st.one_of(st.sampled_from([0, 1, 2, 3, 4]), int_in(INT32_MIN, INT32_MAX))
OTHER_CALLS = st.one_of(
    st.builds(
        lambda r: Call("Bind", r), st.builds(pb.BindRequest, request_id=REQUESTS, worker_id=WORKERS, dp_rank=RANKS)
    ),
    st.builds(
        lambda r: Call("Complete", r),
        st.builds(
            pb.CompleteRequest,
            session_id=SESSIONS,
            request_id=REQUESTS,
            worker_id=WORKERS,
            dp_rank=RANKS,
            prompt_tokens=TOKENS,
            completion_tokens=TOKENS,
            cached_tokens=TOKENS,
            outcome=OUTCOMES,
            ttft_seconds=st.one_of(floats_any(), st.floats(0, 10)),
        ),
    ),
    st.builds(
        lambda r: Call("Complete", r),
        st.builds(  # a plausible Complete, so turns do finish
            pb.CompleteRequest,
            session_id=st.sampled_from(["p0", "p1", "p2", ""]),
            request_id=st.sampled_from(["r0", "r1", "r2", "r3", "r4"]),
            worker_id=st.sampled_from(["w1", "w2", ""]),
            prompt_tokens=st.integers(0, 5_000),
            completion_tokens=st.integers(0, 500),
        ),
    ),
    st.builds(
        lambda r: Call("RenewLeases", r),
        st.builds(
            pb.RenewLeasesRequest,
            request_ids=st.one_of(
                st.lists(REQUESTS, max_size=6), st.sampled_from([10_000, 10_001]).map(lambda n: ["r0"] * n)
            ),
        ),
    ),
    st.builds(lambda r: Call("Release", r), st.builds(pb.ReleaseRequest, session_id=SESSIONS)),
    st.builds(lambda r: Call("GetProgram", r), st.builds(pb.GetProgramRequest, session_id=SESSIONS)),
    st.just(Call("ListPrograms", pb.ListProgramsRequest())),
    st.just(Call("GetStats", pb.GetStatsRequest())),
    st.just(Call("GetRouterConfig", pb.GetRouterConfigRequest())),
)
CALLS = st.integers(0, 2).flatmap(lambda i: ADMITS if i == 0 else OTHER_CALLS)


@dataclass
class Capacity:
    """A WatchWorkers snapshot from the capacity service (HEALTHY or not, any figures)."""

    version: int
    caps: dict
    unhealthy: tuple
    max_programs: int


CAPACITY = st.builds(
    Capacity,
    st.one_of(st.integers(1, 50), int_in(0, 2**64 - 1)),
    st.dictionaries(
        st.tuples(st.sampled_from(["w1", "w2", "w3"]), RANKS),
        st.one_of(st.integers(0, 50_000), int_in(INT64_MIN, INT64_MAX)),
        max_size=3,
    ),
    st.sampled_from([(), ("w2",)]),
    int_in(INT32_MIN, INT32_MAX),
)


@dataclass
class Tick:
    advance_s: float


TICKS = st.builds(Tick, st.one_of(st.just(0.0), st.floats(0, 5), st.sampled_from([31.0, 901.0, 1801.0])))
STEPS = st.integers(0, 9).flatmap(lambda i: CAPACITY if i == 0 else TICKS if i == 1 else CALLS)
SCRIPTS = st.tuples(
    st.builds(Capacity, st.just(1), st.just({("w1", 0): 20_000, ("w2", 0): 20_000}), st.just(()), st.just(0)),
    st.lists(STEPS, min_size=1, max_size=12),
)


# -- running a script -----------------------------------------------------------------------------------


async def call(h, c: Call) -> grpc.StatusCode:
    method = getattr(h.client, c.method)
    try:
        if c.method == "AdmitStream":
            updates = [u async for u in method(c.request, timeout=CALL_TIMEOUT_S)]
            assert updates and updates[-1].WhichOneof("update") == "decision", updates
            assert all(u.WhichOneof("update") == "held" for u in updates[:-1]), updates
            if len(updates) > 1:
                event("AdmitStream held")
        else:
            await method(c.request, timeout=CALL_TIMEOUT_S)
        event(f"{c.method} OK")
        return grpc.StatusCode.OK
    except grpc.aio.AioRpcError as err:
        assert err.code() in CLIENT_ERRORS, (c.method, c.request, err.code(), err.details())
        assert err.details(), (c.method, err.code())
        event(f"{c.method} {err.code().name}")
        return err.code()


async def push(h, cap: Capacity) -> None:
    h.capacity.push(workers_snapshot(cap.version, cap.caps, unhealthy=cap.unhealthy, max_programs=cap.max_programs))
    for _ in range(20):  # let the follower apply it (an old version is ignored)
        await asyncio.sleep(0)


async def resolve_held(h, pending: list[asyncio.Task]) -> None:
    """Every held admission ends once the clock passes its forced-resume deadline."""
    for _ in range(50):
        if all(t.done() for t in pending):
            return
        h.clock.advance(RESUME_TIMEOUT_S + 1)
        h.runtime.fire_due_resumes()
        h.tick()
        await asyncio.sleep(0.001)
    stuck = [t for t in pending if not t.done()]
    raise AssertionError(
        f"{len(stuck)} admissions never ended (held {h.runtime.held_count}, behind a gate {h.runtime.gate_waiting})"
    )


async def run_script(rig: LoopRig, script) -> None:
    first, steps = script
    h = await start_harness(pause_target=0.92)
    try:
        events = h.client.WatchEvents(pb.WatchEventsRequest())
        await push(h, first)
        pending: list[asyncio.Task] = []
        for step in steps:
            if isinstance(step, Call):
                if step.background:
                    pending.append(asyncio.ensure_future(call(h, step)))
                    await asyncio.sleep(0)
                else:
                    await call(h, step)
            elif isinstance(step, Capacity):
                await push(h, step)
            else:
                h.clock.advance(step.advance_s)
                h.runtime.fire_due_resumes()
                h.tick()
            rig.errors.check()
        await resolve_held(h, pending)
        for task in pending:
            task.result()  # a client-error status, checked in `call`
        h.core.ledger.check_invariants(h.clock.monotonic())
        listing = await h.client.ListPrograms(pb.ListProgramsRequest())
        assert len(listing.programs) == len(h.core.programs())
        for program in listing.programs:
            got = await h.client.GetProgram(pb.GetProgramRequest(session_id=program.session_id))
            assert got.session_id == program.session_id
        await h.client.GetStats(pb.GetStatsRequest())
        events.cancel()
        rig.errors.check()
    finally:
        await h.channel.close()
        await h.running.stop()


@pytest.fixture(scope="module")
def rig():
    r = LoopRig()
    yield r
    r.close()


def check_script(rig: LoopRig, script) -> None:
    rig.run(run_script(rig, script))


@given(SCRIPTS)
@settings(NORMAL, max_examples=250)
def test_any_call_sequence_ends_in_client_errors_at_worst_and_keeps_the_table_valid(rig, script):
    check_script(rig, script)


@pytest.mark.slow
@given(SCRIPTS)
@settings(SLOW, max_examples=3_000)
def test_any_call_sequence_ends_in_client_errors_at_worst_and_keeps_the_table_valid_long(rig, script):
    check_script(rig, script)


# -- regressions found by the fuzzing above -------------------------------------------------------------


class _WritingContext:
    """A servicer context whose first `write` (the "held" message of AdmitStream) runs `during_write`."""

    def __init__(self, during_write) -> None:
        self.during_write = during_write
        self.written: list = []

    async def write(self, message) -> None:
        if not self.written:
            self.during_write()
        await asyncio.sleep(0)
        self.written.append(message)

    def time_remaining(self) -> float:
        return 30.0

    def invocation_metadata(self):
        return ()

    async def abort(self, code, details):
        raise AssertionError(f"aborted {code}: {details}")


async def test_admit_stream_resolved_while_held_is_written_answers_the_decision():
    """Found by this module (UNKNOWN from AdmitStream): the program was resumed while the servicer wrote
    "held", so the admission was no longer held when it started to wait for it (KeyError), and the
    already-admitted turn was then rolled back."""
    from opentelemetry import trace

    from services.scheduler.servicer import SchedulerServicer

    h = await start_harness(pause_target=0.92)
    try:
        await push(h, Capacity(1, {("w1", 0): 10_000}, (), 0))
        await h.admit("big", "big-1", 1, timeout=5)
        await h.complete("big", "big-1", 9_500, 0, "w1", 0)
        servicer = SchedulerServicer(h.runtime, h.running.config.kv_router, trace.get_tracer("test"))

        def resume() -> None:
            assert h.runtime.release("big")
            h.tick()

        context = _WritingContext(resume)
        await servicer.AdmitStream(
            pb.AdmitRequest(session_id="p", request_id="p-1", estimated_prompt_tokens=100), context
        )
        kinds = [m.WhichOneof("update") for m in context.written]
        assert kinds == ["held", "decision"], kinds
        assert context.written[-1].decision.was_paused
        assert (await h.program("p")).status == pb.PROGRAM_STATUS_REASONING  # admitted, not rolled back
        h.core.ledger.check_invariants(h.clock.monotonic())
    finally:
        await h.channel.close()
        await h.running.stop()
