"""The compose-equivalent run with BANDMASTER_CONTROL_TOKEN and BANDMASTER_DATA_TOKEN set, as an operator
would to close the published ports: every service-to-service call carries the control token (the
scheduler admits the program; nothing fails open), clients need the data token on the OpenAI and
Batch APIs, and a control RPC without the token is refused."""

from __future__ import annotations

import secrets
import shutil

import grpc
import openai
import pytest

from bandmaster.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from tests.deploy import compose_harness as ch
from tests.deploy.test_compose_run import STARTUP_TIMEOUT_S, agent_program, client, run_batch, sample, scrape

pytestmark = pytest.mark.integration


def test_tokens_guard_the_compose_cluster(tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (make test installs it through `make system-deps`)")
    control, data = secrets.token_hex(16), secrets.token_hex(16)
    env = {"BANDMASTER_CONTROL_TOKEN": control, "BANDMASTER_DATA_TOKEN": data}
    with ch.compose_stack(tmp_path, env, timeout_s=STARTUP_TIMEOUT_S) as stack:
        with pytest.raises(openai.AuthenticationError):
            client(stack, "router-1").models.list()
        agent_program(stack, "compose-secured-agent", api_key=data)
        admissions = sum(  # active and standby: the leader counts them
            sample(scrape(stack.url(name, 9102, "/metrics")), "bandmaster_scheduler_admissions_total")
            for name in ("scheduler", "scheduler-2")
        )
        assert admissions >= 4, "the routers' Admits did not arrive"
        for router in ("router-1", "router-2"):
            metrics = scrape(stack.url(router, 9103, "/metrics"))
            assert sample(metrics, "bandmaster_router_scheduler_fail_open_total") == 0, f"{router} failed open"
        run_batch(stack, api_key=data, n=2)
        with grpc.insecure_channel(f"{stack.stack.addresses['scheduler']}:50052") as channel:
            with pytest.raises(grpc.RpcError) as refused:
                scheduler_pb2_grpc.SchedulerStub(channel).ListPrograms(scheduler_pb2.ListProgramsRequest(), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
