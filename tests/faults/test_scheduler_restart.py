"""The scheduler SIGKILLed and restarted: the program table comes back from its store (SQLite, Redis),
so the decisions after the restart are made with the counts from before it."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from tests.faults.support import Client, metric, start_scheduler
from tests.support.eventually import assert_eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
FLUSH_S = 0.1


async def _build_table(client: Client) -> None:
    """On one replica of 10,000 tokens: a (8,000); its child, b and c (200, 700, 700) paused under pressure;
    and a turn of `a` in flight that leaves no room to resume anything (the table stays put)."""
    await client.wait_replicas(1)
    await client.turn("a", "a-1", 8_000)
    await client.stub.Admit(
        pb.AdmitRequest(session_id="child", parent_session_id="a", request_id="child-1", estimated_prompt_tokens=1),
        timeout=5,
    )
    await client.stub.Complete(
        pb.CompleteRequest(session_id="child", request_id="child-1", prompt_tokens=200), timeout=5
    )
    await client.turn("b", "b-1", 700)
    await client.turn("c", "c-1", 700)

    async def paused():
        programs = await client.programs()
        return programs["b"].lifecycle == programs["c"].lifecycle == pb.LIFECYCLE_PAUSED

    await assert_eventually(paused, timeout_s=10)
    answer = await client.stub.Admit(
        pb.AdmitRequest(session_id="a", request_id="a-2", estimated_prompt_tokens=8_600), timeout=5
    )
    assert answer.pinned or answer.worker_id == ""


def _table(programs: dict[str, pb.Program]) -> dict:
    return {
        sid: (p.status, p.lifecycle, p.token_total, p.tokens_estimated, p.turns, p.parent_session_id, tuple(p.children))
        for sid, p in programs.items()
    }


async def _kill_and_restart(tmp_path, capacity, first, client: Client, store: list[str]):
    await asyncio.sleep(FLUSH_S * 5)  # past the loss window: the last batch is written
    before = _table(await client.programs())
    stats = await client.stats()
    first.kill()
    await first.wait_exit_async()
    await client.close()
    second = await start_scheduler(tmp_path, capacity.address, *store, name="scheduler-2")
    client = Client.connect(second.ready["grpc"])
    return second, client, before, stats


async def _check_recovered(second, client: Client, before: dict, stats_before: pb.Stats) -> None:
    assert _table(await client.programs()) == before
    stats = await client.stats()
    assert stats.state_recovered_programs == 4 and stats.state_recovery_seconds > 0
    assert stats.programs_paused == 3 and stats.pauses_total == stats_before.pauses_total == 3
    assert stats.admissions_total == stats_before.admissions_total
    assert await metric(second, "bandmaster_scheduler_state_recovered_programs") == 4
    assert "scheduler state: recovered 4 programs (3 paused, 1 turns in flight)" in second.log_text()
    await client.wait_replicas(1)
    # The recovered counts decide: `a` still fills the replica, so a new program queues at admission
    # (an empty table would have placed it at once).
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.stub.Admit(
            pb.AdmitRequest(session_id="new", request_id="new-1", estimated_prompt_tokens=2_000), timeout=1.0
        )
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # The turn that was in flight is still a ticket: its Complete counts.
    await client.stub.Complete(
        pb.CompleteRequest(session_id="a", request_id="a-2", prompt_tokens=8_200, completion_tokens=50), timeout=5
    )
    a = (await client.programs())["a"]
    assert a.status == pb.PROGRAM_STATUS_ACTING and a.token_total == 8_250 and a.turns == 2
    assert (await client.stats()).completes_ignored_total == 0


async def test_sigkilled_scheduler_recovers_its_table_from_sqlite(tmp_path, scripted_capacity):
    store = [
        "--state-path",
        str(tmp_path / "state.sqlite"),
        "--state-flush-seconds",
        str(FLUSH_S),
        "--pause-target",
        "0.85",
    ]
    first = await start_scheduler(tmp_path, scripted_capacity.address, *store)
    client = Client.connect(first.ready["grpc"])
    second = None
    try:
        await _build_table(client)
        second, client, before, stats = await _kill_and_restart(tmp_path, scripted_capacity, first, client, store)
        await _check_recovered(second, client, before, stats)
    finally:
        await client.close()
        for proc in (first, second):
            if proc is not None:
                await proc.stop_async()


async def test_sigkilled_scheduler_recovers_its_table_from_redis(tmp_path, scripted_capacity, redis_server):
    store = ["--state-redis-url", redis_server.url, "--state-flush-seconds", str(FLUSH_S), "--pause-target", "0.85"]
    first = await start_scheduler(tmp_path, scripted_capacity.address, *store)
    client = Client.connect(first.ready["grpc"])
    second = None
    try:
        await _build_table(client)
        second, client, before, stats = await _kill_and_restart(tmp_path, scripted_capacity, first, client, store)
        await _check_recovered(second, client, before, stats)
        assert "from redis://127.0.0.1:" in second.log_text()
    finally:
        await client.close()
        for proc in (first, second):
            if proc is not None:
                await proc.stop_async()


async def test_a_second_scheduler_on_the_same_file_is_refused(tmp_path, scripted_capacity):
    path = str(tmp_path / "state.sqlite")
    first = await start_scheduler(tmp_path, scripted_capacity.address, "--state-path", path)
    try:
        with pytest.raises(RuntimeError, match="exited with 2") as err:
            await start_scheduler(tmp_path, scripted_capacity.address, "--state-path", path, name="intruder")
        assert "in use by another scheduler" in str(err.value) and "state_path" in str(err.value)
    finally:
        await first.stop_async()
