"""KV events as the router consumes them: the events and the decoder of SGLang's ZMQ payload are the one
shared set in `services.common.sglang.kv_events` (the simworker encodes the same ones); what applying one to the
index did is the router's own.
"""

from __future__ import annotations

import enum


class EventOutcome(enum.Enum):
    """What applying one event did. The value is a metric label."""

    APPLIED = "applied"
    PARENT_NOT_FOUND = "parent_not_found"  # stored under a parent we do not hold: rejected
    BLOCK_NOT_FOUND = "block_not_found"  # removal of a block we do not hold: ignored
    BLOCK_SIZE_MISMATCH = "block_size_mismatch"  # engine page size != router block size: dropped
    MALFORMED = "malformed"  # token count != blocks x block size: dropped
