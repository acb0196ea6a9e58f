"""SglangPoller against a raw-socket worker: whole bodies however they arrive, bounded in size and time."""

import json
import time

import pytest

from services.capacity.adapters.poller import SglangPoller
from services.capacity.core.cards import CardCache
from services.capacity.core.registry import PollFailed, PollOk
from services.capacity.core.state import Card, CardRejection, CardRejectReason, PollFailureReason
from tests.support.capacity_workers import Answer, RawWorker
from tests.support.sglang_stub import sglang_info

MIB = 1024 * 1024


def padded_info(size: int) -> bytes:
    """A valid /server_info body of about `size` bytes (real bodies grow with internal_states)."""
    info = sglang_info(max_total_num_tokens=4096, page_size=16)
    info["internal_states"] = [{"pad": "x" * max(0, size - len(json.dumps(info)) - 20)}]
    return json.dumps(info).encode()


async def poll_once(
    answer: Answer, *, timeout_s: float = 2.0, max_body_bytes: int = 8 * MIB, cache: CardCache | None = None
):
    worker = await RawWorker(answer).start()
    poller = SglangPoller(timeout_s, CardCache() if cache is None else cache, max_body_bytes=max_body_bytes)
    await poller.start()
    try:
        return await poller.poll(worker.url)
    finally:
        await poller.close()
        await worker.stop()


@pytest.mark.parametrize(
    "size, pieces, chunked",
    [
        (5 * 1024, 4, False),
        (5 * 1024, 4, True),
        (300 * 1024, 8, False),
        (300 * 1024, 8, True),
        (2 * MIB, 16, False),
        (2 * MIB, 16, True),
    ],
)
async def test_body_arriving_in_pieces_is_read_whole(size, pieces, chunked):
    # Regression (issue 11): only what had arrived was read, so these were "malformed JSON".
    result = await poll_once(Answer(padded_info(size), pieces=pieces, delay_s=0.01, chunked=chunked))
    assert isinstance(result, PollOk) and isinstance(result.card, Card), result
    assert result.card.gpu_kv_tokens == 4096


@pytest.mark.parametrize("chunked", [False, True])
async def test_body_over_the_cap_is_a_rejection(chunked):
    result = await poll_once(Answer(padded_info(64 * 1024), pieces=4, chunked=chunked), max_body_bytes=16 * 1024)
    assert isinstance(result, PollOk) and isinstance(result.card, CardRejection), result
    assert result.card.reason is CardRejectReason.BODY_TOO_LARGE
    assert str(result.card) == "server_info: body exceeds 16384 bytes"


async def test_declared_length_over_the_cap_is_refused_before_reading():
    answer = Answer(b"{}", declared_length=10 * MIB, delay_s=5.0)  # the body would never come
    started = time.monotonic()
    result = await poll_once(answer, max_body_bytes=MIB)
    assert time.monotonic() - started < 1.0
    assert isinstance(result, PollOk) and result.card.reason is CardRejectReason.BODY_TOO_LARGE


async def test_body_trickling_past_the_deadline_times_out():
    started = time.monotonic()
    result = await poll_once(Answer(padded_info(2048), pieces=20, delay_s=0.05), timeout_s=0.3)
    assert time.monotonic() - started < 0.8
    assert result == PollFailed(PollFailureReason.TIMEOUT, "no complete answer within 0.3s")


async def test_truncated_body_is_a_connection_failure():
    body = padded_info(4096)
    result = await poll_once(Answer(body[:1000], declared_length=len(body)))
    assert isinstance(result, PollFailed) and result.reason is PollFailureReason.CONNECTION, result


async def test_a_derivation_bug_is_a_rejection_not_an_exception():
    class Broken(CardCache):
        def parse(self, worker, body):
            raise ZeroDivisionError("bug")

    result = await poll_once(Answer(padded_info(1024)), cache=Broken())
    assert isinstance(result, PollOk) and result.card.reason is CardRejectReason.DERIVATION_ERROR
    assert str(result.card) == "server_info: card derivation failed (ZeroDivisionError)"


async def test_frozen_worker_times_out_within_the_bound():
    worker = await RawWorker(Answer(b"{}")).start()
    worker.frozen = True
    poller = SglangPoller(0.3, CardCache())
    await poller.start()
    try:
        started = time.monotonic()
        result = await poller.poll(worker.url)
        assert time.monotonic() - started < 0.8
        assert isinstance(result, PollFailed) and result.reason is PollFailureReason.TIMEOUT
    finally:
        await poller.close()
        await worker.stop()
