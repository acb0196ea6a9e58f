"""KV events in SGLang's ZMQ wire format (reference/kvrouter_sglang.md §C.11): the simworker encodes them,
the router decodes them. Pure: bytes in, dataclasses out, and back; the sockets belong to the shells.

The shapes mirror SGLang's publisher (`sglang/srt/disaggregation/kv_events.py`):

    frame 3 = msgpack [ts: float, events: list, attn_dp_rank: int | None]   (older: [ts, events])
    event   = ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, ...]
            | ["BlockRemoved", block_hashes, medium]
            | ["AllBlocksCleared"]
            (or a map with key "type" and the same field names; decoded, never encoded)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgpack

DEFAULT_MEDIUM = "GPU"


@dataclass(frozen=True)
class BlockStored:
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str = DEFAULT_MEDIUM  # "GPU" | "CPU_PINNED"


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: tuple[int, ...]
    medium: str = DEFAULT_MEDIUM


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True)
class EventBatch:
    ts: float
    events: tuple[KvEvent, ...]
    dp_rank: int | None
    skipped: int = 0  # events of unknown type or shape, dropped


class EventDecodeError(ValueError):
    """A payload that is not an SGLang KV event batch at all."""


def encode_event(event: KvEvent) -> list:
    """One event as SGLang's tagged array (lora_id always None)."""
    if isinstance(event, BlockStored):
        return [
            "BlockStored",
            list(event.block_hashes),
            event.parent_block_hash,
            list(event.token_ids),
            event.block_size,
            None,
            event.medium,
        ]
    if isinstance(event, BlockRemoved):
        return ["BlockRemoved", list(event.block_hashes), event.medium]
    if isinstance(event, AllBlocksCleared):
        return ["AllBlocksCleared"]
    raise TypeError(f"not a KV event: {event!r}")


def encode_batch(ts: float, events: Iterable[KvEvent], dp_rank: int | None) -> bytes:
    """The msgpack frame of one published batch."""
    return msgpack.packb([ts, [encode_event(e) for e in events], dp_rank], use_bin_type=True)


def _medium(value: Any) -> str:
    return value if isinstance(value, str) and value else DEFAULT_MEDIUM


def _event_from_fields(tag: str, fields: list[Any]) -> KvEvent | None:
    if tag == "BlockStored" and len(fields) >= 4:
        hashes, parent, tokens, block_size = fields[:4]
        medium = fields[5] if len(fields) > 5 else None
        return BlockStored(
            tuple(int(h) for h in hashes),
            None if parent is None else int(parent),
            tuple(int(t) for t in tokens),
            int(block_size),
            _medium(medium),
        )
    if tag == "BlockRemoved" and len(fields) >= 1:
        medium = fields[1] if len(fields) > 1 else None
        return BlockRemoved(tuple(int(h) for h in fields[0]), _medium(medium))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def _event_from_map(raw: dict[Any, Any]) -> KvEvent | None:
    tag = raw.get("type")
    if tag == "BlockStored":
        fields = [
            raw.get("block_hashes", ()),
            raw.get("parent_block_hash"),
            raw.get("token_ids", ()),
            raw.get("block_size", 0),
            raw.get("lora_id"),
            raw.get("medium"),
        ]
    elif tag == "BlockRemoved":
        fields = [raw.get("block_hashes", ()), raw.get("medium")]
    else:
        fields = []
    return _event_from_fields(tag, fields) if isinstance(tag, str) else None


def decode_event_batch(payload: bytes) -> EventBatch:
    """Decode the msgpack frame of one published batch. Unknown events are skipped and counted."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise EventDecodeError(f"not msgpack: {exc}") from None
    if not isinstance(raw, (list, tuple)) or len(raw) < 2 or not isinstance(raw[1], (list, tuple)):
        raise EventDecodeError("expected [ts, events, dp_rank?]")
    dp_rank = raw[2] if len(raw) > 2 and isinstance(raw[2], int) else None
    events: list[KvEvent] = []
    skipped = 0
    for item in raw[1]:
        event = None
        try:
            if isinstance(item, (list, tuple)) and item and isinstance(item[0], str):
                event = _event_from_fields(item[0], list(item[1:]))
            elif isinstance(item, dict):
                event = _event_from_map(item)
        except (TypeError, ValueError):
            event = None
        if event is None:
            skipped += 1
        else:
            events.append(event)
    return EventBatch(float(raw[0]), tuple(events), dp_rank, skipped)
