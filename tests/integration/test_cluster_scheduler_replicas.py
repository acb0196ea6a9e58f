"""The cluster `bandmaster up --scheduler-replicas 2` starts: two schedulers on the state dir's shared file,
one leading; a program's turns go on across the leader's SIGKILL (the router follows, nothing fails open,
no turn is lost), and `bandmaster status` names the leader."""

from __future__ import annotations

import time

import grpc
import openai
import pytest

from bandmaster.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.cli import status
from services.launcher.cluster import ClusterConfig, start_cluster
from services.launcher.supervisor import http_ok
from tests.support.eventually import wait_until
from tests.support.router_stack import metric

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def _view(address: str) -> scheduler_pb2.Leadership | None:
    with grpc.insecure_channel(address) as channel:
        try:
            return scheduler_pb2_grpc.SchedulerStub(channel).GetLeadership(
                scheduler_pb2.GetLeadershipRequest(), timeout=1
            )
        except grpc.RpcError:
            return None


def _turns(address: str, sid: str) -> int:
    with grpc.insecure_channel(address) as channel:
        program = scheduler_pb2_grpc.SchedulerStub(channel).GetProgram(
            scheduler_pb2.GetProgramRequest(session_id=sid), timeout=5
        )
    return program.turns


async def _fail_open(cluster) -> float:
    return await metric(
        f"http://127.0.0.1:{cluster.router.ready['metrics_port']}", "bandmaster_router_scheduler_fail_open_total"
    )


async def test_two_replicas_and_the_leaders_death(tmp_path):
    cluster = start_cluster(
        ClusterConfig(
            workers=1, worker_speedup=50.0, http_port=0, state_dir=tmp_path, scheduler_state=True, scheduler_replicas=2
        )
    )
    try:
        assert len(cluster.schedulers) == 2 and "," in cluster.scheduler_addrs
        wait_until(lambda: http_ok(cluster.http_url + "/health"), timeout_s=30, interval_s=0.1)
        client = openai.OpenAI(
            base_url=cluster.http_url + "/v1",
            api_key="none",
            max_retries=0,
            timeout=30,
            default_headers={"X-Dynamo-Session-ID": "agent"},
        )

        def turn(i: int) -> None:
            client.chat.completions.create(
                model="bandmaster-sim", max_tokens=2, messages=[{"role": "user", "content": f"turn {i}"}]
            )

        turn(0)
        views = {child.endpoint: _view(child.endpoint) for child in cluster.schedulers}
        assert sorted(v.role for v in views.values()) == ["leader", "standby"]
        leader = next(c for c in cluster.schedulers if views[c.endpoint].role == "leader")
        standby = next(c for c in cluster.schedulers if c is not leader)
        text = status.render(status.take_snapshot(_status_args(), _addresses(cluster), ""), "")
        assert f"{leader.endpoint} LEADER (epoch 1)" in text and f"{standby.endpoint} standby" in text

        leader.process.kill()
        killed_at = time.monotonic()
        turn(1)  # waits for the new leader: the router follows it
        followed_s = time.monotonic() - killed_at
        turn(2)
        assert followed_s <= 5.0, followed_s
        assert _view(standby.endpoint).role == "leader"
        assert _turns(standby.endpoint, "agent") == 3
        assert await _fail_open(cluster) == 0
    finally:
        cluster.stop()


def _addresses(cluster) -> dict[str, str]:
    return {"capacity": cluster.capacity.endpoint, "scheduler": cluster.scheduler_addrs, "planner": "127.0.0.1:1"}


def _status_args():
    import argparse

    return argparse.Namespace(
        timeout_seconds=2.0, tls_ca="", tls_cert="", tls_key="", control_token_file="", state_dir=None
    )
