"""The one set of KV events: what the simworker encodes, the router decodes to the same dataclasses."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.common.sglang import kv_events
from services.common.sglang.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    decode_event_batch,
    encode_batch,
)
from services.router.core import events as router_events
from services.simworker.core import api as engine_api

_hashes = st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4).map(tuple)
_medium = st.sampled_from(["GPU", "CPU_PINNED"])
_event = st.one_of(
    st.builds(
        BlockStored,
        _hashes,
        st.none() | st.integers(-(2**63), 2**63 - 1),
        st.lists(st.integers(0, 2**31), max_size=8).map(tuple),
        st.integers(1, 256),
        _medium,
    ),
    st.builds(BlockRemoved, _hashes, _medium),
    st.just(AllBlocksCleared()),
)


@given(st.floats(0, 2e9, allow_nan=False), st.lists(_event, max_size=6), st.none() | st.integers(0, 7))
def test_what_is_encoded_decodes_to_the_same_events(ts, events, dp_rank):
    batch = decode_event_batch(encode_batch(ts, events, dp_rank))
    assert (batch.ts, batch.events, batch.dp_rank, batch.skipped) == (ts, tuple(events), dp_rank, 0)


def test_the_events_are_defined_once():
    for name in ("BlockStored", "BlockRemoved", "AllBlocksCleared"):
        assert getattr(kv_events, name).__module__ == "services.common.sglang.kv_events"
        assert not hasattr(router_events, name) and not hasattr(engine_api, name)
