"""Property-based fuzzing of `bandmaster.router.v1.Router` (Generate, Release) against an in-process router
whose worker is healthy (tests/fuzz/router_rig.py).

Session ids, models, roles, contents, prompts and request ids are odd strings (controls, non-ASCII, around
the 256-byte bound, long); `max_tokens` spans int32; temperature and top_p are NaN, infinite, negative or huge;
stop lists are empty, long or odd; the input oneof is unset, empty or either kind; metadata carries odd
authorization values and trace contexts. Whatever is sent:

* every call ends OK or with a deliberate client-error status (never UNKNOWN or INTERNAL); an OK stream ends
  with one chunk that has a finish_reason and usage;
* nothing reaches the worker that is not a JSON object of its API's shape, nothing is logged at ERROR, and
  afterwards the router still serves a turn.

`make test` runs a few hundred examples (derandomized); `make test-slow` runs thousands.
"""

from __future__ import annotations

import grpc
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from bandmaster.router.v1 import router_pb2 as pb
from bandmaster.router.v1 import router_pb2_grpc as pb_grpc
from tests.fuzz.common import (
    CLIENT_ERRORS,
    INT32_MAX,
    INT32_MIN,
    NORMAL,
    PROTO_TEXT,
    RATE_LIMITED,
    SLOW,
    floats_any,
    int_in,
)
from tests.fuzz.router_rig import RouterRig
from tests.support.router_doubles import MODEL


def mostly(usual: st.SearchStrategy, odd: st.SearchStrategy) -> st.SearchStrategy:
    return st.integers(0, 3).flatmap(lambda i: odd if i == 0 else usual)


SESSIONS = mostly(st.sampled_from(["", "prog-1", "prog-2", "agent/42"]), PROTO_TEXT)
TEXT = mostly(st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=20), PROTO_TEXT)
MESSAGES = st.lists(
    st.builds(pb.ChatMessage, role=mostly(st.sampled_from(["user", "assistant", "system"]), PROTO_TEXT), content=TEXT),
    max_size=3,
)
SAMPLING = st.builds(
    pb.SamplingParams,
    max_tokens=mostly(st.integers(0, 64), int_in(INT32_MIN, INT32_MAX)),
    stop=mostly(st.lists(TEXT, max_size=2), st.lists(PROTO_TEXT, max_size=40)),
    **{name: mostly(st.floats(0, 1), floats_any()) for name in ("temperature", "top_p")},
)


@st.composite
def generate_requests(draw) -> pb.GenerateRequest:
    request = pb.GenerateRequest(
        session_id=draw(SESSIONS),
        parent_session_id=draw(SESSIONS),
        model=draw(mostly(st.sampled_from(["", MODEL]), PROTO_TEXT)),
        request_id=draw(mostly(st.just(""), PROTO_TEXT)),
    )
    if draw(st.integers(0, 4)):
        request.sampling.CopyFrom(draw(SAMPLING))
        for name in ("temperature", "top_p"):
            if draw(st.booleans()):
                request.sampling.ClearField(name)
    which = draw(st.integers(0, 3))
    if which == 1:
        request.prompt = draw(mostly(TEXT, st.just("")))
    elif which >= 2:
        request.chat.messages.extend(draw(MESSAGES))
    return request


METADATA = st.lists(
    st.tuples(
        st.sampled_from(["authorization", "traceparent", "x-dynamo-session-id", "x-odd"]),
        mostly(
            st.sampled_from(["Bearer t", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"]),
            st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30),
        ),
    ),
    max_size=2,
)
CALLS = st.one_of(
    st.tuples(st.just("Generate"), generate_requests(), METADATA),
    st.tuples(st.just("Release"), st.builds(pb.ReleaseRequest, session_id=SESSIONS), METADATA),
)


async def call(rig: RouterRig, stub: pb_grpc.RouterStub, method: str, request, metadata) -> grpc.StatusCode:
    try:
        if method == "Generate":
            chunks = [c async for c in stub.Generate(request, metadata=tuple(metadata), timeout=10)]
            assert chunks and chunks[-1].finish_reason, chunks
            assert all(not c.finish_reason for c in chunks[:-1]), chunks
            assert chunks[-1].finish_reason != "error", chunks[-1]  # the worker is healthy
        else:
            await stub.Release(request, metadata=tuple(metadata), timeout=10)
        code = grpc.StatusCode.OK
    except grpc.aio.AioRpcError as err:
        code = err.code()
        assert code in CLIENT_ERRORS or code == RATE_LIMITED, (method, request, code, err.details())
        assert err.details()
    if currently_in_test_context():
        event(f"{method} {code.name}")
    return code


class GrpcRig(RouterRig):
    def __init__(self) -> None:
        super().__init__()
        self.channel = self.run(self._channel())
        self.stub = pb_grpc.RouterStub(self.channel)

    async def _channel(self) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(self.router.running.grpc_address)

    def close(self) -> None:
        self.run(self.channel.close())
        super().close()


def check_call(rig: GrpcRig, method: str, request, metadata) -> None:
    rig.run(call(rig, rig.stub, method, request, metadata))
    rig.errors.check()
    rig.check_worker()
    assert rig.server_errors() == 0
    rig.trim()


def check_serves(rig: GrpcRig) -> None:
    request = pb.GenerateRequest(session_id="after-fuzz", prompt="hi")
    assert rig.run(call(rig, rig.stub, "Generate", request, ())) == grpc.StatusCode.OK


@pytest.fixture(scope="module")
def rig():
    r = GrpcRig()
    yield r
    check_serves(r)
    r.close()


@given(CALLS)
@settings(NORMAL, max_examples=300)
def test_any_generate_or_release_ends_in_a_client_error_at_worst(rig, c):
    check_call(rig, *c)


def test_the_router_still_serves_a_turn(rig):
    check_serves(rig)


@pytest.mark.slow
@given(CALLS)
@settings(SLOW, max_examples=3_000)
def test_any_generate_or_release_ends_in_a_client_error_at_worst_long(rig, c):
    check_call(rig, *c)
