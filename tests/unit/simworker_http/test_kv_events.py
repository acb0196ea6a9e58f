"""The ZMQ publisher against a real SUB (and REQ for replay) socket."""

from __future__ import annotations

import asyncio

import msgpack
import zmq
import zmq.asyncio

from services.common.sglang.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, encode_event
from services.simworker.config import KvEventsConfig
from services.simworker.kv_events import KvEventPublisher, should_bind
from tests.support.eventually import assert_eventually


def test_bind_rule():
    assert should_bind("tcp://*:5557") and should_bind("tcp://0.0.0.0:1") and should_bind("ipc:///tmp/x")
    assert not should_bind("tcp://127.0.0.1:5557")


def test_event_encoding():
    assert encode_event(BlockStored((1, 2), None, (5, 6, 7, 8), 2)) == [
        "BlockStored",
        [1, 2],
        None,
        [5, 6, 7, 8],
        2,
        None,
        "GPU",
    ]
    assert encode_event(BlockRemoved((3,), "CPU_PINNED")) == ["BlockRemoved", [3], "CPU_PINNED"]
    assert encode_event(AllBlocksCleared()) == ["AllBlocksCleared"]


async def test_publish_to_real_sub_socket_and_replay():
    publisher = KvEventPublisher(
        KvEventsConfig(publisher="zmq", endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", topic="kv")
    )
    await publisher.start()
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(publisher.endpoint)
    try:
        # PUB/SUB joins asynchronously: publish until the subscriber sees something.
        async def received():
            publisher.publish(1.5, (BlockStored((11,), None, (1, 2), 2),))
            return await sub.poll(timeout=50)

        await assert_eventually(received, timeout_s=10)
        topic, seq, payload = await sub.recv_multipart()
        assert topic == b"kv" and len(seq) == 8
        ts, events, rank = msgpack.unpackb(payload)
        assert ts == 1.5 and rank == 0
        assert events == [["BlockStored", [11], None, [1, 2], 2, None, "GPU"]]
        first_seq = int.from_bytes(seq, "big")
        publisher.publish(2.0, (BlockRemoved((11,)), AllBlocksCleared()))
        while True:
            _, seq2, payload2 = await asyncio.wait_for(sub.recv_multipart(), 5)
            if msgpack.unpackb(payload2)[1][0][0] == "BlockRemoved":
                break
        assert int.from_bytes(seq2, "big") > first_seq
        assert msgpack.unpackb(payload2)[1] == [["BlockRemoved", [11], "GPU"], ["AllBlocksCleared"]]

        # A DEALER sends [b"", start_seq] and reads [b"", seq, payload]... then [b"", -1, b""].
        req = ctx.socket(zmq.DEALER)
        req.connect(publisher.replay_endpoint)
        last = int.from_bytes(seq2, "big")
        await req.send_multipart((b"", last.to_bytes(8, "big")))
        replayed = []
        while True:
            frames = await asyncio.wait_for(req.recv_multipart(), 5)
            assert frames[0] == b""
            if frames[1] == (-1).to_bytes(8, "big", signed=True):
                break
            assert msgpack.unpackb(frames[2])[0] == 2.0
            replayed.append(int.from_bytes(frames[1], "big"))
            if len(replayed) > 100:
                break
        req.close(linger=0)
        assert replayed == [last]
    finally:
        sub.close(linger=0)
        ctx.destroy(linger=0)
        await publisher.close()


async def test_server_publishes_engine_events_and_flush(make_worker):
    import aiohttp

    worker = await make_worker("--kv-events-endpoint", "tcp://127.0.0.1:*", "--page-size", "4")
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(worker.kv_events_endpoint)
    seen: list = []
    try:
        async with aiohttp.ClientSession() as http:
            attempt = [0]

            async def stored_seen():
                # Requests until the (asynchronously joined) subscriber has seen a BlockStored. Each
                # attempt sends a new prompt: a repeated one would hit the cache and store nothing.
                attempt[0] += 1
                first = 300 + 100 * attempt[0]
                async with http.post(
                    worker.url + "/generate",
                    json={"input_ids": list(range(first, first + 21)), "sampling_params": {"max_new_tokens": 1}},
                ) as r:
                    assert r.status == 200
                while await sub.poll(timeout=20):
                    seen.extend(msgpack.unpackb((await sub.recv_multipart())[2])[1])
                return any(e[0] == "BlockStored" for e in seen)

            await assert_eventually(stored_seen, timeout_s=10)
            stored = next(e for e in seen if e[0] == "BlockStored")
            assert stored[4] == 4 and len(stored[3]) == 4 * len(stored[1])
            async with http.post(worker.url + "/flush_cache") as r:
                assert r.status == 200

            async def cleared_seen():
                while await sub.poll(timeout=20):
                    seen.extend(msgpack.unpackb((await sub.recv_multipart())[2])[1])
                return ["AllBlocksCleared"] in seen

            await assert_eventually(cleared_seen, timeout_s=5)
    finally:
        sub.close(linger=0)
        ctx.destroy(linger=0)


async def test_server_info_reports_the_bound_publisher_endpoint(make_worker):
    """With a wildcard port, /server_info must name the port subscribers can actually reach."""
    import json as _json

    import aiohttp

    worker = await make_worker("--kv-events-endpoint", "tcp://127.0.0.1:*")
    async with aiohttp.ClientSession() as http:
        async with http.get(worker.url + "/server_info") as r:
            info = await r.json()
    reported = _json.loads(info["kv_events_config"])
    assert reported["publisher"] == "zmq"
    assert reported["endpoint"] == worker.kv_events_endpoint
    assert not reported["endpoint"].endswith(":*")
