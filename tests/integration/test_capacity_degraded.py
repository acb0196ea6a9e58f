"""A real simworker started without --enable-cache-report and --enable-priority-scheduling, beside one
started with both, polled by a real capacity process: the card says what is off, a WARNING naming the
flag is logged once, and the degraded gauge is 1 for that worker only."""

from __future__ import annotations

import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bandmaster.capacity.v1 import capacity_pb2 as pb
from bandmaster.capacity.v1 import capacity_pb2_grpc as pb_grpc
from tests.support.eventually import assert_eventually
from tests.support.processes import python_module, start

pytestmark = pytest.mark.integration


def _simworker(tmp_path, name: str, *flags: str):
    ready = tmp_path / f"{name}.ready.json"
    argv = python_module(
        "services.simworker", "--port", "0", "--ready-file", str(ready), "--max-total-tokens", "4096", *flags
    )
    return start(name, argv, tmp_path, ready_file=ready)


def _degraded_gauge(port: int) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.labels["worker_id"], s.labels["reason"]): s.value
        for family in text_string_to_metric_families(text)
        if family.name == "bandmaster_capacity_worker_degraded"
        for s in family.samples
    }


async def test_a_worker_without_cache_reports_is_flagged_on_the_card_in_the_log_and_the_metric(tmp_path):
    with (
        _simworker(tmp_path, "bare").wait_ready() as bare,
        _simworker(tmp_path, "full", "--enable-cache-report", "--enable-priority-scheduling").wait_ready() as full,
    ):
        bare_url = f"http://127.0.0.1:{bare.ready['port']}"
        full_url = f"http://127.0.0.1:{full.ready['port']}"
        ready = tmp_path / "capacity.ready.json"
        capacity = start(
            "capacity",
            python_module(
                "services.capacity",
                "--worker-url",
                bare_url,
                "--worker-url",
                full_url,
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
            ),
            tmp_path,
            ready_file=ready,
        )
        async with capacity:
            info = (await capacity.wait_ready_async()).ready
            async with grpc.aio.insecure_channel(info["grpc"]) as channel:
                client = pb_grpc.CapacityStub(channel)

                async def both_healthy():
                    snap = await client.ListWorkers(pb.ListWorkersRequest(), timeout=5)
                    workers = {w.url: w for w in snap.workers}
                    assert all(w.health == pb.WORKER_HEALTH_HEALTHY for w in workers.values()) and len(workers) == 2
                    return workers

                workers = await assert_eventually(both_healthy, timeout_s=20)
            assert list(workers[bare_url].card.degraded) == [
                pb.DEGRADATION_CACHE_REPORT_OFF,
                pb.DEGRADATION_PRIORITY_SCHEDULING_OFF,
            ]
            assert list(workers[full_url].card.degraded) == []
            # A degraded worker keeps its whole budget: it serves, Bandmaster only knows less.
            assert [r.retention_tokens for r in workers[bare_url].replicas] == [4096]

            bare_id, full_id = workers[bare_url].worker_id, workers[full_url].worker_id
            assert _degraded_gauge(info["metrics_port"]) == {
                (bare_id, "cache_report_off"): 1,
                (bare_id, "priority_scheduling_off"): 1,
                (full_id, "cache_report_off"): 0,
                (full_id, "priority_scheduling_off"): 0,
            }

            logged = await capacity.wait_for_log_async(f"worker {bare_id} degraded: none -> cache_report_off")
            line = logged.rstrip("\n").rsplit("\n", 1)[-1]
            assert "WARNING" in line and "--enable-cache-report" in line and "--enable-priority-scheduling" in line
            # Once per transition, not once per poll (several polls have run by now).
            await capacity.wait_for_log_async(f"worker {full_id} health")
            assert capacity.log_text().count(f"worker {bare_id} degraded") == 1
            assert f"worker {full_id} degraded" not in capacity.log_text()
