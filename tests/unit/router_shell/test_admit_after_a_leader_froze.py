"""The router's scheduler client when the leader it follows freezes (chaos finding 11): a fast-path
(dispatched) Admit sent to the frozen leader moves on to the successor within its bound, and a call that
failed at the frozen leader after the router was answered by the successor does not take the scheduler for
down (which failed every turn open for a breaker interval while the new leader answered)."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from bandmaster.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from services.router.adapters.scheduler import SchedulerClient
from services.router.core.breaker import BreakerParams
from services.router.observe.metrics import RouterMetrics
from tests.support.router_doubles import WithoutAdmitMux

pytestmark = pytest.mark.timeout(30)
DECISION_S = 0.5


class Replica(WithoutAdmitMux):
    """A scheduler replica that answers every Admit at once, or (`frozen`) never: a SIGSTOPped leader's
    socket accepts the call and nothing comes back."""

    def __init__(self, frozen: bool) -> None:
        self.frozen = frozen
        self.admitted: list[str] = []

    async def AdmitStream(self, request, context):
        if self.frozen:
            await asyncio.sleep(60)
        self.admitted.append(request.request_id)
        yield pb.AdmitUpdate(decision=pb.AdmitResponse(worker_id=request.dispatched_worker_id or "w1"))


async def _serve(replica: Replica) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    pb_grpc.add_SchedulerServicer_to_server(replica, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
async def pair():
    frozen, leader = Replica(frozen=True), Replica(frozen=False)
    (s1, a1), (s2, a2) = await _serve(frozen), await _serve(leader)
    metrics = RouterMetrics()
    client = SchedulerClient(
        f"{a1},{a2}",  # the router follows the first: the leader that froze
        metrics,
        call_timeout_s=DECISION_S,
        decision_timeout_s=DECISION_S,
        hold_timeout_s=30.0,
        breaker=BreakerParams(1, 5.0, 5.0),
        failover_s=5.0,
    )
    yield client, frozen, leader, a2, metrics
    await client.close()
    for server in (s1, s2):
        await server.stop(0)


def _failed_open(metrics: RouterMetrics) -> float:
    return sum(
        sample.value for m in metrics.fail_open.collect() for sample in m.samples if sample.name.endswith("_total")
    )


async def test_a_dispatched_admit_sent_to_a_frozen_leader_is_counted_at_its_successor(pair):
    client, frozen, leader, successor, metrics = pair
    started = time.monotonic()
    dispatched = asyncio.create_task(client.admit("p1", "", "r-fast", 10, dispatched=("w1", 0)))
    await asyncio.sleep(0.05)
    # Another turn's Admit (normal path) times out at the frozen leader and finds the successor.
    assert await client.admit("p2", "", "r-normal", 10) is not None
    assert client.address == successor and not client.in_outage
    admission = await dispatched
    # Before: the dispatched try waited the whole 5 s bound at the frozen leader, then failed open (the
    # turn uncounted) and opened the breaker.
    assert admission is not None and admission.worker_id == "w1"
    assert "r-fast" in leader.admitted and time.monotonic() - started < 3 * DECISION_S + 1.0
    assert not client.in_outage and _failed_open(metrics) == 0


async def test_a_failure_older_than_an_answer_does_not_open_the_breaker(pair):
    client, _, _, _, _ = pair
    began = time.monotonic()
    client._ok()  # a call reached the scheduler after `began`
    client._down("Admit", "no answer to Admit within 0.5s", began=began)
    assert not client.in_outage
    client._down("Admit", "no answer to Admit within 0.5s", began=time.monotonic())
    assert client.in_outage
