"""Property-based fuzzing of what a worker can send the capacity service as `/server_info`.

Whatever the body (random JSON values of any type and nesting, huge numbers, NaN/Infinity as
literals or strings, missing fields, truncated or mutated bodies, random bytes, deep nesting),
and however it arrives (pieces, chunked or Content-Length), no exception escapes, and the
outcome is either a valid card that fits a snapshot or a clean rejection whose reason fits one.

`make test` runs a few hundred examples per property; `make test-slow` (`-m slow`) runs >= 10,000.
"""

from __future__ import annotations

import asyncio
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.capacity.adapters.poller import SglangPoller
from services.capacity.adapters.proto import snapshot_to_proto
from services.capacity.core.cards import (
    MAX_DP_SIZE,
    MAX_PAGE_SIZE,
    MAX_TEXT_CHARS,
    MAX_TOKENS,
    CardCache,
    RetentionSettings,
    derive_card,
    parse_card,
    recompute,
)
from services.capacity.core.registry import PollFailed, PollOk
from services.capacity.core.state import Card, CardRejection, CardRejectReason, Health, Origin, WorkerState
from tests.support.capacity_workers import Answer, RawWorker
from tests.support.sglang_stub import sglang_info

NORMAL = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SLOW_EXAMPLES = 10_000
INT32_MAX = 2**31 - 1

# --- strategies ---

SPECIAL_NUMBERS = st.sampled_from(
    [
        0,
        1,
        -1,
        0.5,
        1e305,
        -1e305,
        1e300,
        1e308,
        5e-324,
        math.inf,
        -math.inf,
        math.nan,
        2**31,
        2**40,
        2**40 + 1,
        2**53 + 1,
        2**63,
        2**64,
        10**400,
        -(10**400),
        4096,
        4097,
        65536,
        65537,
        1.0,
        16.0,
        16.5,
    ]
)
NUMBER_STRINGS = st.sampled_from(["NaN", "Infinity", "-Infinity", "inf", "nan", "1e400", "-0", "16", "0x10", "", " "])
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-(2**1000), 2**1000),
    st.floats(allow_nan=True, allow_infinity=True),
    SPECIAL_NUMBERS,
    NUMBER_STRINGS,
    st.text(max_size=20),
    st.text(min_size=500, max_size=700).filter(lambda t: len(t) > MAX_TEXT_CHARS),
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)
# A field's value: mostly numbers (where the arithmetic is), sometimes anything.
FIELD_VALUES = st.one_of(
    SPECIAL_NUMBERS, st.floats(min_value=1.0, allow_infinity=True), st.integers(1, 2**70), JSON_VALUES
)

FIELDS = [
    "max_total_num_tokens",
    "page_size",
    "dp_size",
    "enable_hierarchical_cache",
    "hicache_ratio",
    "hicache_size",
    "hicache_write_policy",
    "hicache_host_total_tokens",
    "kv_bytes_per_token",
    "hicache_storage_backend",
    "dcp_size",
    "model_path",
    "served_model_name",
    "architectures",
    "max_running_requests",
    "enable_dp_attention",
    "context_length",
    "version",
]


@st.composite
def server_infos(draw) -> object:
    """Mostly a realistic body with some fields replaced, removed or added; sometimes any JSON value."""
    if draw(st.integers(0, 9)) == 0:
        return draw(JSON_VALUES)
    info = sglang_info(
        enable_hierarchical_cache=draw(st.integers(0, 2)) > 0,
        hicache_write_policy=draw(st.sampled_from(["write_back", "write_through", "x"])),
    )
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=6, unique=True)):
        if draw(st.integers(0, 4)) == 0:
            info.pop(name, None)
        else:
            info[name] = draw(FIELD_VALUES)
    for name, value in draw(st.dictionaries(st.text(max_size=10), JSON_VALUES, max_size=3)).items():
        info[name] = value
    return info


def encode(value: object) -> bytes:
    """JSON text as a lax server would write it (NaN/Infinity literals allowed); unencodable -> a marker body."""
    try:
        return json.dumps(value, allow_nan=True).encode("utf-8", "surrogatepass")
    except (ValueError, OverflowError):  # ints with more than 4300 digits
        return b'{"too": "big"}'


@st.composite
def bodies(draw) -> bytes:
    kind = draw(st.integers(0, 7))
    if kind == 0:
        return draw(st.binary(max_size=200))
    if kind == 1:  # deep nesting, open or closed
        depth = draw(st.sampled_from([10, 900, 1100, 5000, 200_000]))
        opener = draw(st.sampled_from([b"[", b'{"a":']))
        return opener * depth + (b"]" * depth if opener == b"[" and draw(st.booleans()) else b"")
    body = encode(draw(server_infos()))
    if kind == 2 and body:  # truncated
        return body[: draw(st.integers(0, len(body) - 1))]
    if kind == 3 and body:  # a few bytes mutated
        data = bytearray(body)
        for _ in range(draw(st.integers(1, 4))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        return bytes(data)
    return body


# --- the invariant ---


def check_outcome(result: object) -> None:
    assert isinstance(result, (Card, CardRejection)), result
    if isinstance(result, Card):
        assert 0 < result.gpu_kv_tokens <= MAX_TOKENS + result.page_size
        assert 1 <= result.page_size <= MAX_PAGE_SIZE and 1 <= result.dp_size <= MAX_DP_SIZE
        assert 0 <= result.host_kv_tokens <= MAX_TOKENS
        assert 0 <= result.max_running_requests <= INT32_MAX and 0 <= result.context_length <= MAX_TOKENS
        for text in (result.model_name, result.version, result.hicache_write_policy, result.hicache_storage_backend):
            assert len(text) <= MAX_TEXT_CHARS
        state = WorkerState("w", "http://w:1", Origin.RPC, 0.0, health=Health.HEALTHY, card=result)
    else:
        assert isinstance(result.reason, CardRejectReason)
        assert str(result).startswith("server_info: ") and len(str(result)) <= 300
        state = WorkerState("w", "http://w:1", Origin.RPC, 0.0, health=Health.UNHEALTHY, rejection=result)
    for cap in (False, True):
        view = recompute(RetentionSettings(cap_host_at_gpu=cap), [state])
        (worker,) = view.workers
        assert bool(worker.replicas) == isinstance(result, Card)
        assert worker.excluded_reason == ("" if isinstance(result, Card) else str(result))
        # It must fit a snapshot: every watcher receives it.
        snapshot_to_proto(view, 1, 0.0).SerializeToString()


def check_body(body: bytes) -> None:
    result = parse_card(body)
    check_outcome(result)
    assert parse_card(body) == result  # deterministic, so memoising it is sound


# --- pure derivation ---


@given(server_infos())
@settings(max_examples=300, **NORMAL)
def test_derive_card_never_raises(info):
    check_outcome(derive_card(info))


@given(bodies())
@settings(max_examples=300, **NORMAL)
def test_parse_card_never_raises(body):
    check_body(body)


@pytest.mark.slow
@given(server_infos())
@settings(max_examples=SLOW_EXAMPLES, **NORMAL)
def test_derive_card_never_raises_long(info):
    check_outcome(derive_card(info))


@pytest.mark.slow
@given(bodies())
@settings(max_examples=SLOW_EXAMPLES, **NORMAL)
def test_parse_card_never_raises_long(body):
    check_body(body)


# --- the poller's body handling, over a real socket ---

CAP = 4096


class PollRig:
    """One event loop, one raw worker and one poller for all examples (a server per example is too slow)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.worker = RawWorker(Answer(b"{}"))
        self.poller = SglangPoller(2.0, CardCache(), max_body_bytes=CAP)
        self.loop.run_until_complete(self.worker.start())
        self.loop.run_until_complete(self.poller.start())

    def poll(self, answer: Answer):
        self.worker.answer = answer
        return self.loop.run_until_complete(self.poller.poll(self.worker.url))

    def close(self) -> None:
        self.loop.run_until_complete(self.poller.close())
        self.loop.run_until_complete(self.worker.stop())
        self.loop.close()


@pytest.fixture(scope="module")
def rig():
    r = PollRig()
    yield r
    r.close()


ARRIVALS = st.fixed_dictionaries(
    {"pieces": st.integers(1, 12), "chunked": st.booleans(), "delay_s": st.sampled_from([0.0, 0.0, 0.001])}
)
SIZED_BODIES = st.one_of(
    bodies(), st.builds(lambda n: encode({**sglang_info(), "pad": "x" * n}), st.integers(CAP - 1200, CAP + 200))
)


def check_poll(rig: PollRig, body: bytes, arrival: dict) -> None:
    result = rig.poll(Answer(body, **arrival))
    assert isinstance(result, (PollOk, PollFailed)), result
    assert isinstance(result, PollOk), result  # a complete 200 answer is never a poll failure
    if len(body) > CAP:
        assert result.card == CardRejection(CardRejectReason.BODY_TOO_LARGE, f"body exceeds {CAP} bytes")
    else:
        assert result.card == parse_card(body)  # the whole body, however it arrived
        check_outcome(result.card)


@given(SIZED_BODIES, ARRIVALS)
@settings(max_examples=150, **NORMAL)
def test_poller_reads_any_body_however_it_arrives(rig, body, arrival):
    check_poll(rig, body, arrival)


@pytest.mark.slow
@given(SIZED_BODIES, ARRIVALS)
@settings(max_examples=SLOW_EXAMPLES, **NORMAL)
def test_poller_reads_any_body_however_it_arrives_long(rig, body, arrival):
    check_poll(rig, body, arrival)
