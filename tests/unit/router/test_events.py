import msgpack
import pytest

from services.common.sglang.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventDecodeError,
    decode_event_batch,
)


def test_decodes_sglang_tagged_arrays():
    payload = msgpack.packb(
        [
            1700000000.5,
            [
                ["BlockStored", [-7, 9], None, list(range(8)), 4, None, "GPU"],
                ["BlockStored", [11], 9, [1, 2, 3, 4], 4, None, None],  # medium None -> GPU
                ["BlockRemoved", [9], "CPU_PINNED"],
                ["AllBlocksCleared"],
            ],
            2,
        ]
    )
    batch = decode_event_batch(payload)
    assert batch.ts == 1700000000.5 and batch.dp_rank == 2 and batch.skipped == 0
    assert batch.events == (
        BlockStored((-7, 9), None, tuple(range(8)), 4, "GPU"),
        BlockStored((11,), 9, (1, 2, 3, 4), 4, "GPU"),
        BlockRemoved((9,), "CPU_PINNED"),
        AllBlocksCleared(),
    )


def test_decodes_older_batches_and_map_events():
    payload = msgpack.packb(
        [
            1.0,
            [
                {
                    "type": "BlockStored",
                    "block_hashes": [1],
                    "parent_block_hash": None,
                    "token_ids": [5, 6],
                    "block_size": 2,
                },
                {"type": "BlockRemoved", "block_hashes": [1]},
                ["SomethingNew", 1, 2],
                ["BlockStored", "not-a-list"],
            ],
        ]
    )
    batch = decode_event_batch(payload)
    assert batch.dp_rank is None
    assert batch.events == (BlockStored((1,), None, (5, 6), 2), BlockRemoved((1,)))
    assert batch.skipped == 2


@pytest.mark.parametrize("payload", [b"\xc1", msgpack.packb({"ts": 1}), msgpack.packb([1.0])])
def test_rejects_payloads_that_are_not_batches(payload):
    with pytest.raises(EventDecodeError):
        decode_event_batch(payload)
