"""KV events as the router consumes them, and the decoder of SGLang's ZMQ payload.

The shapes mirror SGLang's publisher (`sglang/srt/disaggregation/kv_events.py`):

    frame 3 = msgpack [ts: float, events: list, attn_dp_rank: int | None]   (older: [ts, events])
    event   = ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, ...]
            | ["BlockRemoved", block_hashes, medium]
            | ["AllBlocksCleared"]
            (or a map with key "type" and the same field names)

Decoding is pure (bytes in, dataclasses out); the socket belongs to the shell.
"""

from __future__ import annotations

import enum
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
    medium: str = DEFAULT_MEDIUM


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
    skipped: int = 0        # events of unknown type or shape, dropped


class EventOutcome(enum.Enum):
    """What applying one event did. The value is a metric label."""

    APPLIED = "applied"
    PARENT_NOT_FOUND = "parent_not_found"          # stored under a parent we do not hold: rejected
    BLOCK_NOT_FOUND = "block_not_found"            # removal of a block we do not hold: ignored
    BLOCK_SIZE_MISMATCH = "block_size_mismatch"    # engine page size != router block size: dropped
    MALFORMED = "malformed"                        # token count != blocks x block size: dropped


class EventDecodeError(ValueError):
    """A payload that is not an SGLang KV event batch at all."""


def _medium(value: Any) -> str:
    return value if isinstance(value, str) and value else DEFAULT_MEDIUM


def _event_from_fields(tag: str, fields: list[Any]) -> KvEvent | None:
    if tag == "BlockStored" and len(fields) >= 4:
        hashes, parent, tokens, block_size = fields[:4]
        medium = fields[5] if len(fields) > 5 else None
        return BlockStored(tuple(int(h) for h in hashes), None if parent is None else int(parent),
                           tuple(int(t) for t in tokens), int(block_size), _medium(medium))
    if tag == "BlockRemoved" and len(fields) >= 1:
        medium = fields[1] if len(fields) > 1 else None
        return BlockRemoved(tuple(int(h) for h in fields[0]), _medium(medium))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def _event_from_map(raw: dict[Any, Any]) -> KvEvent | None:
    tag = raw.get("type")
    if tag == "BlockStored":
        fields = [raw.get("block_hashes", ()), raw.get("parent_block_hash"), raw.get("token_ids", ()),
                  raw.get("block_size", 0), raw.get("lora_id"), raw.get("medium")]
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
