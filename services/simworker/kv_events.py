"""KV-event publisher in SGLang's ZMQ wire format (reference/kvrouter_sglang.md §C.11).

Each engine step's events become one batch, sent as three frames:

    [topic, seq (8-byte big-endian, from 0), msgpack([ts, [event, ...], attn_dp_rank])]

with events as tagged arrays (`services.common.sglang.kv_events`, which the router decodes with):

    ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]
    ["BlockRemoved", block_hashes, medium]
    ["AllBlocksCleared"]

Endpoints containing `*`, `::`, `0.0.0.0`, `ipc://` or `inproc://` are bound, others are
connected (SGLang's rule). With a `replay_endpoint`, a ROUTER socket answers
`[identity, b"", start_seq]` with every buffered batch whose seq >= start_seq as
`[identity, b"", seq, payload]`, then `[identity, b"", -1, b""]`.
Sending never blocks the engine loop: a full PUB queue drops the batch (ZMQ's HWM rule).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Iterable

import zmq
import zmq.asyncio

from services.common.sglang.kv_events import KvEvent, encode_batch
from services.simworker.config import KvEventsConfig

log = logging.getLogger(__name__)

ATTN_DP_RANK = 0
_END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)


def should_bind(endpoint: str) -> bool:
    return any(marker in endpoint for marker in ("*", "::", "0.0.0.0", "ipc://", "inproc://"))


class KvEventPublisher:
    """One PUB socket (plus an optional replay ROUTER) for one attention-DP rank."""

    def __init__(self, config: KvEventsConfig, context: zmq.Context | None = None) -> None:
        self.config = config
        self._own_context = context is None
        self._ctx = context or zmq.Context()
        self._topic = config.topic.encode()
        self._seq = 0
        self._buffer: collections.deque[tuple[bytes, bytes]] = collections.deque(maxlen=max(config.buffer_steps, 1))
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, config.hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        self.endpoint = self._attach(self._pub, config.endpoint)
        self._replay: zmq.asyncio.Socket | None = None
        self.replay_endpoint: str | None = None
        self._replay_task: asyncio.Task | None = None
        self.sent_batches = 0
        self.dropped_batches = 0

    @staticmethod
    def _attach(sock: zmq.Socket, endpoint: str) -> str:
        if should_bind(endpoint):
            sock.bind(endpoint)
            # With tcp://*:0 ZMQ picks the port; report what was actually bound.
            return sock.getsockopt_string(zmq.LAST_ENDPOINT) or endpoint
        sock.connect(endpoint)
        return endpoint

    async def start(self) -> None:
        """Open the replay socket, if configured (needs a running event loop)."""
        if not self.config.replay_endpoint:
            return
        actx = zmq.asyncio.Context.shadow(self._ctx)
        self._replay = actx.socket(zmq.ROUTER)
        self._replay.setsockopt(zmq.LINGER, 0)
        self.replay_endpoint = self._attach(self._replay, self.config.replay_endpoint)
        self._replay_task = asyncio.create_task(self._serve_replay(), name="kv-events-replay")

    def publish(self, ts: float, events: Iterable[KvEvent]) -> None:
        payload = encode_batch(ts, events, ATTN_DP_RANK)
        seq = self._seq.to_bytes(8, "big")
        self._seq += 1
        if self.config.buffer_steps > 0:
            self._buffer.append((seq, payload))
        try:
            self._pub.send_multipart((self._topic, seq, payload), flags=zmq.NOBLOCK)
            self.sent_batches += 1
        except zmq.Again:
            self.dropped_batches += 1

    async def _serve_replay(self) -> None:
        assert self._replay is not None
        while True:
            frames = await self._replay.recv_multipart()
            if len(frames) < 3 or len(frames[-1]) != 8:
                log.debug("kv-events replay: ignoring malformed request of %d frames", len(frames))
                continue
            identity, start_seq = frames[0], int.from_bytes(frames[-1], "big")
            for seq, payload in list(self._buffer):
                if int.from_bytes(seq, "big") >= start_seq:
                    await self._replay.send_multipart((identity, b"", seq, payload))
            await self._replay.send_multipart((identity, b"", _END_OF_REPLAY, b""))

    async def close(self) -> None:
        if self._replay_task is not None:
            self._replay_task.cancel()
            try:
                await self._replay_task
            except asyncio.CancelledError:
                pass
        if self._replay is not None:
            self._replay.close(linger=0)
        self._pub.close(linger=0)
        if self._own_context:
            self._ctx.destroy(linger=0)
