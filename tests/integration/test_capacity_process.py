"""`python -m services.capacity` as a real subprocess against sglang_stub servers.

WatchWorkers follows every step: a flag worker comes up, a worker registers over RPC, restarts
with different info, breaks (health failing -> UNHEALTHY -> removed), and one is deregistered.
"""

import asyncio
import signal

import grpc
import pytest

from bandmaster.capacity.v1 import capacity_pb2 as pb
from bandmaster.capacity.v1 import capacity_pb2_grpc as pb_grpc
from tests.support.eventually import assert_eventually
from tests.support.processes import base_env, python_module, run_module, start
from tests.support.sglang_stub import SglangStub, sglang_info

pytestmark = pytest.mark.integration
H = pb.WorkerHealth


@pytest.mark.parametrize(
    "argv, env, message",
    [
        (
            ["--poll-interval-seconds", "1", "--poll-timeout-seconds", "2"],
            {},
            "poll_timeout_seconds <= poll_interval_seconds",
        ),
        ([], {"BANDMASTER_CAPACITY_UNHEALTHY_AFTER_FAILURES": "0"}, "unhealthy_after_failures >= 1"),
        (["--worker-url", "ftp://x:1"], {}, "scheme must be http or https"),
    ],
)
def test_invalid_config_exits_2_naming_the_rule(argv, env, message):
    proc = run_module("services.capacity", *argv, env=base_env(**env))
    assert proc.returncode == 2
    assert message in proc.stderr and "invalid configuration" in proc.stderr


class Watch:
    """Collects every snapshot of one WatchWorkers stream in the background."""

    def __init__(self, client):
        self.snapshots: list[pb.WorkersSnapshot] = []
        self.stream = client.WatchWorkers(pb.WatchWorkersRequest())
        self.task = asyncio.create_task(self._run())

    async def _run(self):
        async for snap in self.stream:
            self.snapshots.append(snap)

    def latest(self) -> dict[str, pb.Worker]:
        assert self.snapshots, "no snapshot yet"
        return {w.worker_id: w for w in self.snapshots[-1].workers}

    async def until(self, predicate, timeout_s=15.0):
        async def check():
            return predicate(self.latest())

        return await assert_eventually(check, timeout_s=timeout_s)

    def stop(self):
        self.stream.cancel()


async def test_capacity_process_follows_workers(tmp_path):
    a = SglangStub(sglang_info(max_total_num_tokens=1000, page_size=1))
    b = SglangStub(
        sglang_info(
            max_total_num_tokens=4000,
            page_size=16,
            enable_hierarchical_cache=True,
            hicache_write_policy="write_back",
            hicache_host_total_tokens=500,
            dp_size=2,
        )
    )
    await a.start()
    await b.start()
    ready = tmp_path / "ready.json"
    proc = start(
        "capacity",
        python_module(
            "services.capacity",
            "--worker-url",
            a.url,
            "--listen",
            "127.0.0.1:0",
            "--metrics-port",
            "0",
            "--ready-file",
            str(ready),
            "--poll-interval-seconds",
            "0.2",
            "--poll-timeout-seconds",
            "0.2",
            "--unhealthy-after-failures",
            "2",
            "--remove-unhealthy-after-seconds",
            "1",
            "--watch-heartbeat-seconds",
            "0.5",
            "--shutdown-grace-seconds",
            "1",
        ),
        tmp_path,
        ready_file=ready,
    )
    watch = None
    try:
        info = (await proc.wait_ready_async()).ready
        async with grpc.aio.insecure_channel(info["grpc"]) as channel:
            client = pb_grpc.CapacityStub(channel)
            watch = Watch(client)
            a_id = f"127.0.0.1:{a.port}"

            # 1. the flag worker comes up
            await watch.until(lambda ws: a_id in ws and ws[a_id].health == H.WORKER_HEALTH_HEALTHY)
            assert watch.latest()[a_id].origin == pb.WORKER_ORIGIN_FLAG
            assert watch.snapshots[-1].total_retention_tokens == 1000

            # 2. add: RegisterWorker
            await client.RegisterWorker(pb.RegisterWorkerRequest(url=b.url, worker_id="b"))
            await watch.until(lambda ws: "b" in ws and ws["b"].health == H.WORKER_HEALTH_HEALTHY)
            replicas = watch.latest()["b"].replicas
            assert [(r.dp_rank, r.retention_tokens, r.retention_source) for r in replicas] == [
                (0, 4500, pb.RETENTION_SOURCE_GPU_PLUS_HOST),
                (1, 4500, pb.RETENTION_SOURCE_GPU_PLUS_HOST),
            ]
            assert watch.snapshots[-1].total_retention_tokens == 1000 + 9000

            # 3. change: restart with different info
            await b.restart(sglang_info(max_total_num_tokens=8000, page_size=16), down_seconds=0.1)
            await watch.until(
                lambda ws: ws["b"].card.gpu_kv_tokens == 8000 and ws["b"].health == H.WORKER_HEALTH_HEALTHY
            )
            assert watch.snapshots[-1].total_retention_tokens == 1000 + 8000

            # 4. break: health failing -> UNHEALTHY (kept, no budget) -> removed
            b.fail("health", "status", 503)
            await watch.until(lambda ws: "b" in ws and ws["b"].health == H.WORKER_HEALTH_UNHEALTHY)
            assert watch.snapshots[-1].total_retention_tokens == 1000
            await watch.until(lambda ws: "b" not in ws)

            # 5. remove: DeregisterWorker (a flag worker may be removed too, until restart)
            assert (await client.DeregisterWorker(pb.DeregisterWorkerRequest(worker_id=a_id))).removed
            await watch.until(lambda ws: ws == {})

            versions = [s.version for s in watch.snapshots if not s.heartbeat]
            assert versions == sorted(set(versions)), "versions strictly increase between real snapshots"
            # Quiet now: heartbeats arrive with the same version.
            count = len(watch.snapshots)
            await assert_eventually(lambda: len(watch.snapshots) > count and watch.snapshots[-1].heartbeat, timeout_s=5)
            assert watch.snapshots[-1].version == versions[-1]
            watch.stop()
        proc.send_signal(signal.SIGTERM)
        assert await proc.wait_exit_async(20) == 0
        stderr = proc.log_text()
        assert "worker b card_changed" in stderr and "gpu_kv_tokens=4000" in stderr
        assert "worker b health: HEALTHY -> UNHEALTHY" in stderr
        assert "worker b removed" in stderr
    finally:
        if watch is not None:
            watch.stop()
        await proc.stop_async()
        await a.stop()
        await b.stop()
