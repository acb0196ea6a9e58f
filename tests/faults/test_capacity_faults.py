"""Fault injection against a real `python -m services.capacity` process (issue 11).

Workers that freeze (accept the connection, never answer), answer slowly in pieces, or are
killed. Each case checks the outcome within its bound and that the service keeps answering
ListWorkers and WatchWorkers promptly meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import time

import grpc
import pytest

from bandmaster.capacity.v1 import capacity_pb2 as pb
from bandmaster.capacity.v1 import capacity_pb2_grpc as pb_grpc
from tests.support.capacity_workers import Answer, RawWorker
from tests.support.eventually import assert_eventually
from tests.support.router_stack import capacity, spawn
from tests.support.sglang_stub import sglang_info

pytestmark = pytest.mark.integration
H = pb.WorkerHealth
POLL_S = 0.3  # poll interval = poll timeout
# A failing worker is UNHEALTHY within one interval + one timeout (unhealthy after 1 failure);
# the slack absorbs process scheduling on a loaded 2-core machine.
UNHEALTHY_BOUND_S = POLL_S + POLL_S + 1.5
PROMPT_S = 0.25  # the longest a ListWorkers may take while a poll is stuck


def info(tokens: int) -> dict:
    return sglang_info(max_total_num_tokens=tokens, page_size=1)


async def start_capacity(tmp_path, urls, *args):
    return await capacity(
        tmp_path,
        urls,
        "--poll-interval-seconds",
        str(POLL_S),
        "--poll-timeout-seconds",
        str(POLL_S),
        "--unhealthy-after-failures",
        "1",
        "--watch-heartbeat-seconds",
        "0.5",
        "--transition-log-interval-seconds",
        "0",
        *args,
    )


class Watch:
    """Every snapshot of one WatchWorkers stream, with its arrival time."""

    def __init__(self, client):
        self.snapshots: list[tuple[float, pb.WorkersSnapshot]] = []
        self.stream = client.WatchWorkers(pb.WatchWorkersRequest())
        self.task = asyncio.create_task(self._run())

    async def _run(self):
        async for snap in self.stream:
            self.snapshots.append((time.monotonic(), snap))

    def workers(self) -> dict[str, pb.Worker]:
        return {w.worker_id: w for w in self.snapshots[-1][1].workers} if self.snapshots else {}

    async def until(self, predicate, timeout_s):
        return await assert_eventually(lambda: predicate(self.workers()), timeout_s=timeout_s, interval_s=0.01)

    def stop(self):
        self.stream.cancel()


async def list_workers_promptly(client) -> dict[str, pb.Worker]:
    started = time.monotonic()
    snap = await client.ListWorkers(pb.ListWorkersRequest(), timeout=5)
    assert time.monotonic() - started < PROMPT_S, "ListWorkers was held up"
    return {w.worker_id: w for w in snap.workers}


def no_tracebacks(proc) -> None:
    text = proc.log_text()
    assert "Traceback" not in text and "crashed" not in text, text[-3000:]


async def test_frozen_worker_times_out_and_the_service_stays_responsive(tmp_path):
    frozen = await RawWorker(Answer.json(info(1000))).start()
    steady = await RawWorker(Answer.json(info(2000))).start()
    proc = await start_capacity(tmp_path, [frozen.url, steady.url])
    frozen_id, steady_id = f"127.0.0.1:{frozen.port}", f"127.0.0.1:{steady.port}"
    try:
        async with grpc.aio.insecure_channel(proc.ready["grpc"]) as channel:
            client = pb_grpc.CapacityStub(channel)
            watch = Watch(client)
            await watch.until(
                lambda ws: all(w.health == H.WORKER_HEALTH_HEALTHY for w in ws.values()) and len(ws) == 2, timeout_s=10
            )
            frozen.frozen = True
            froze_at = time.monotonic()
            w = await watch.until(
                lambda ws: ws[frozen_id].health == H.WORKER_HEALTH_UNHEALTHY and ws[frozen_id],
                timeout_s=UNHEALTHY_BOUND_S,
            )
            assert time.monotonic() - froze_at < UNHEALTHY_BOUND_S
            assert w.excluded_reason == "unhealthy: polls failing (last: timeout)" and not w.replicas
            # While every poll of the frozen worker hangs until its deadline: prompt answers, the other
            # worker's budget untouched, watch heartbeats flowing.
            seen = len(watch.snapshots)
            for _ in range(10):
                ws = await list_workers_promptly(client)
                assert (
                    ws[steady_id].health == H.WORKER_HEALTH_HEALTHY
                    and ws[steady_id].replicas[0].retention_tokens == 2000
                )
                assert ws[frozen_id].excluded_reason == "unhealthy: polls failing (last: timeout)"
                await asyncio.sleep(0.1)
            await assert_eventually(lambda: any(s.heartbeat for _, s in watch.snapshots[seen:]), timeout_s=2)
            gaps = [b - a for (a, _), (b, _) in zip(watch.snapshots[seen:], watch.snapshots[seen + 1 :])]
            assert all(g < 0.5 + PROMPT_S * 2 for g in gaps), gaps
            # Thawed: back after confirm_increase_polls (2) good polls.
            frozen.frozen = False
            await watch.until(lambda ws: ws[frozen_id].health == H.WORKER_HEALTH_HEALTHY, timeout_s=5)
            watch.stop()
        no_tracebacks(proc)
    finally:
        await proc.stop_async()
        await frozen.stop()
        await steady.stop()


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_slow_worker_answering_in_pieces_is_accepted(tmp_path, chunked):
    body = json.dumps({**info(3000), "internal_states": [{"pad": "x" * 300_000}]}).encode()
    # 10 pieces 0.1 s apart: the body takes ~1 s, inside the 1.5 s poll deadline.
    slow = await RawWorker(Answer(body, pieces=10, delay_s=0.1, chunked=chunked)).start()
    proc = await capacity(tmp_path, [slow.url], "--poll-interval-seconds", "1.5", "--poll-timeout-seconds", "1.5")
    try:
        async with grpc.aio.insecure_channel(proc.ready["grpc"]) as channel:
            client = pb_grpc.CapacityStub(channel)
            watch = Watch(client)
            w = await watch.until(
                lambda ws: (
                    len(ws) == 1
                    and next(iter(ws.values())).health != H.WORKER_HEALTH_PENDING
                    and next(iter(ws.values()))
                ),
                timeout_s=10,
            )
            assert w.health == H.WORKER_HEALTH_HEALTHY, w.excluded_reason
            assert w.card.gpu_kv_tokens == 3000 and w.replicas[0].retention_tokens == 3000
            await list_workers_promptly(client)  # also while the next slow poll is in flight
            watch.stop()
        no_tracebacks(proc)
    finally:
        await proc.stop_async()
        await slow.stop()


async def test_a_killed_worker_is_unhealthy_then_removed(tmp_path):
    stub = await spawn(
        "worker",
        "tests.support.sglang_stub",
        ["--port", "0", "--max-total-num-tokens", "1000", "--page-size", "1"],
        tmp_path,
    )
    proc = await start_capacity(tmp_path, [], "--remove-unhealthy-after-seconds", "1")
    try:
        async with grpc.aio.insecure_channel(proc.ready["grpc"]) as channel:
            client = pb_grpc.CapacityStub(channel)
            await client.RegisterWorker(pb.RegisterWorkerRequest(url=stub.ready["url"], worker_id="victim"))
            watch = Watch(client)
            await watch.until(
                lambda ws: "victim" in ws and ws["victim"].health == H.WORKER_HEALTH_HEALTHY, timeout_s=10
            )
            assert watch.snapshots[-1][1].total_retention_tokens == 1000
            stub.kill()
            await stub.wait_exit_async()
            killed_at = time.monotonic()
            w = await watch.until(
                lambda ws: ws["victim"].health == H.WORKER_HEALTH_UNHEALTHY and ws["victim"],
                timeout_s=UNHEALTHY_BOUND_S,
            )
            assert w.excluded_reason == "unhealthy: polls failing (last: connection)"
            assert watch.snapshots[-1][1].total_retention_tokens == 0
            await list_workers_promptly(client)
            # Removed once it has been failing for --remove-unhealthy-after-seconds (1 s), at the next round.
            await watch.until(lambda ws: "victim" not in ws, timeout_s=1 + UNHEALTHY_BOUND_S + POLL_S)
            assert time.monotonic() - killed_at < 1 + 2 * UNHEALTHY_BOUND_S
            watch.stop()
        no_tracebacks(proc)
        assert "worker victim removed" in proc.log_text()
    finally:
        await proc.stop_async()
        await stub.stop_async()
