"""The planner and the batch service end to end through the router: `bandmaster up` as a user starts them, the
official `openai` client on the ROUTER's base URL (files.create, batches.create, batches.retrieve until completed,
files.content: one output line per request with its custom_id); with `--planner-connector local` a batch
makes the planner start workers (the capacity service sees them) and stop them again once it is done;
a planner and then a batch service SIGKILLed mid-batch and restarted behind the same router lose and duplicate
nothing."""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import signal
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import openai
import pytest

from bandmaster.capacity.v1 import capacity_pb2 as cpb
from bandmaster.capacity.v1 import capacity_pb2_grpc as cpb_grpc
from services.launcher.cluster import ClusterConfig, start_cluster
from services.launcher.supervisor import Supervisor
from tests.support.eventually import wait_until
from tests.support.processes import Process, python_module, run_module, start

pytestmark = pytest.mark.integration
MODEL = "bandmaster-sim"


def batch_file(n: int) -> bytes:
    lines = [
        json.dumps(
            {
                "custom_id": f"r{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": MODEL, "messages": [{"role": "user", "content": f"say {i}"}], "max_tokens": 4},
            }
        )
        for i in range(n)
    ]
    return ("\n".join(lines) + "\n").encode()


def submit(client: openai.OpenAI, n: int, window: str = "1h"):
    f = client.files.create(file=("in.jsonl", io.BytesIO(batch_file(n))), purpose="batch")
    return client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window=window)


def completed(client: openai.OpenAI, batch_id: str, timeout_s: float):
    def done():
        b = client.batches.retrieve(batch_id)
        assert b.status not in ("failed", "expired", "cancelled"), b
        return b if b.status == "completed" else None

    return wait_until(done, timeout_s=timeout_s, interval_s=0.25)


def assert_exactly_once(client: openai.OpenAI, batch, n: int) -> None:
    assert batch.request_counts.total == n and batch.request_counts.completed == n, batch.request_counts
    lines = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
    assert sorted(x["custom_id"] for x in lines) == sorted(f"r{i}" for i in range(n))  # none lost, none twice
    assert all(x["response"]["status_code"] == 200 and x["response"]["body"]["choices"] for x in lines)


def _up(state: Path, *extra: str) -> tuple[Process, str]:
    proc = start(
        "bandmaster-up",
        python_module(
            "services.cli",
            "up",
            "--worker-kv-tokens",
            "8192",
            "--speedup",
            "50",
            "--ports",
            "auto",
            "--state-dir",
            str(state),
            *extra,
        ),
        state.parent,
    )
    output = proc.wait_for_log("Ctrl-C to stop", timeout_s=120)
    assert "Bandmaster is up" in output and "Batch API:" in output, output
    router = json.loads((state / "router.ready.json").read_text())
    return proc, f"http://127.0.0.1:{router['http_port']}/v1"


def test_a_batch_through_the_routers_base_url_of_bandmaster_up(tmp_path):
    state = tmp_path / "state"
    proc, base_url = _up(state, "--workers", "2")
    try:
        planner = json.loads((state / "planner.ready.json").read_text())
        assert {"grpc", "metrics_port", "pid"} <= set(planner) and "http" not in planner  # control only
        batch_ready = json.loads((state / "batch.ready.json").read_text())
        assert {"grpc", "metrics_port", "http", "pid"} <= set(batch_ready)
        client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
        n = 30
        batch = submit(client, n)
        assert assert_exactly_once(client, completed(client, batch.id, 90), n) is None
        assert [b.id for b in client.batches.list()] == [batch.id]
        with pytest.raises(openai.NotFoundError):  # the batch service's 404 body, through the router
            client.batches.retrieve("batch_missing")
        _deep_json_is_a_400_through_the_router(client, base_url)
        # The router counted the batch service's requests as batch traffic, not online.
        metrics = json.loads((state / "router.ready.json").read_text())["metrics_port"]
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5).read().decode()
        batch_ok = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("bandmaster_router_requests_total{")
            and 'traffic="batch"' in line
            and 'outcome="ok"' in line
        )
        assert batch_ok >= n
        # The CLI on the same cluster, found through the state dir: it talks to the batch service's own address.
        (tmp_path / "in.jsonl").write_bytes(batch_file(3))
        cli = functools.partial(run_module, "services.cli")
        submitted = cli("batch", "--state-dir", str(state), "submit", str(tmp_path / "in.jsonl"), "--window", "24h")
        assert submitted.returncode == 0, submitted.stderr
        cli_batch = submitted.stdout.strip()
        completed(client, cli_batch, 60)
        shown = cli("batch", "--state-dir", str(state), "get", cli_batch, "--output")
        assert (
            shown.returncode == 0
            and '"status": "completed"' in shown.stdout
            and '"custom_id":"r2"' in shown.stdout.replace(" ", "")
        )
        listed = cli("batch", "--state-dir", str(state), "list")
        assert listed.returncode == 0 and cli_batch in listed.stdout and batch.id in listed.stdout
        plan = cli("plan", "--state-dir", str(state))
        assert plan.returncode == 0, plan.stderr
        assert "replica opinions" in plan.stdout and "final" in plan.stdout and "online traffic" in plan.stdout
    finally:
        proc.stop(grace_s=60)
    assert proc.returncode == 0


def _deep_json_is_a_400_through_the_router(client: openai.OpenAI, base_url: str) -> None:
    """Issue 21: a JSONL line or a /v1/batches body nested 1,000+ deep was a 500 (then the planner's)."""
    deep = b"[" * 1_500 + b"]" * 1_500
    line = b'{"custom_id": "d", "method": "POST", "url": "/v1/chat/completions", "body": {"x": ' + deep + b"}}\n"
    with pytest.raises(openai.BadRequestError) as info:
        client.files.create(file=("deep.jsonl", io.BytesIO(line)), purpose="batch")
    assert info.value.body["code"] == "invalid_json_line"
    body = b'{"input_file_id": "file-x", "endpoint": "/v1/chat/completions", "completion_window": "24h", "metadata": '
    request = urllib.request.Request(
        base_url + "/batches", data=body + deep + b"}", headers={"Content-Type": "application/json"}, method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 400
    assert "nested deeper than" in json.loads(refused.value.read())["error"]["message"]


def _local_workers(capacity_addr: str) -> int:
    with grpc.insecure_channel(capacity_addr) as ch:
        snap = cpb_grpc.CapacityStub(ch).ListWorkers(cpb.ListWorkersRequest(), timeout=5)
    return sum(w.health == cpb.WORKER_HEALTH_HEALTHY for w in snap.workers)


def test_the_local_connector_scales_up_for_a_batch_and_back_to_the_idle_target(tmp_path):
    state = tmp_path / "state"
    # One replica drains 10 rps safely; 700 requests due in a minute need two.
    proc, base_url = _up(
        state,
        "--workers",
        "1",
        "--planner-connector",
        "local",
        "--planner-max-replicas",
        "3",
        "--planner-arg=--safe-rps-per-replica=10",
        "--planner-arg=--finalization-margin-seconds=2",
    )
    try:
        capacity = json.loads((state / "capacity.ready.json").read_text())["grpc"]
        wait_until(lambda: _local_workers(capacity) == 1, timeout_s=60, interval_s=0.25)
        client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
        n = 700
        batch = submit(client, n, window="1m")
        wait_until(lambda: _local_workers(capacity) >= 2, timeout_s=45, interval_s=0.25)
        assert_exactly_once(client, completed(client, batch.id, 75), n)
        wait_until(lambda: _local_workers(capacity) == 1, timeout_s=45, interval_s=0.25)
    finally:
        proc.stop(grace_s=60)


def _restart_on_the_same_ports(cluster, child):
    """SIGKILL `child` and start its spec again listening on the gRPC port it had bound (its flags may say 0)."""
    child.process.send_signal(signal.SIGKILL)
    child.process.wait(timeout=10)
    cluster.supervisor.children.remove(child)
    args = list(child.spec.args)
    args[args.index("--listen") + 1] = child.ready["grpc"]
    spec = dataclasses.replace(child.spec, args=args)
    (new,) = cluster.supervisor.start_all([spec])
    return new


def test_a_planner_and_a_batch_service_killed_mid_batch_lose_and_duplicate_nothing(tmp_path):
    cluster = start_cluster(
        ClusterConfig(
            workers=2,
            worker_kv_tokens=8192,
            worker_speedup=50,
            http_port=0,
            planner=True,
            log_level="WARNING",
            planner_args=("--max-batch-admission-rps=8",),
        ),
        Supervisor(tmp_path / "state"),
    )
    try:
        client = openai.OpenAI(base_url=cluster.http_url + "/v1", api_key="unused", max_retries=0)
        n = 60
        batch = submit(client, n)

        def done_at_least(k):
            def check():
                b = client.batches.retrieve(batch.id)
                return b if k <= b.request_counts.completed < n else None

            return check

        wait_until(done_at_least(5), timeout_s=60, interval_s=0.1)
        # The planner (control only) dies and comes back on its port: the batch service follows its lease again.
        cluster.planner = _restart_on_the_same_ports(cluster, cluster.planner)
        wait_until(done_at_least(15), timeout_s=60, interval_s=0.1)
        # The batch service (the data) dies: the same Batch API port (the router's --batch-url), the same registry.
        cluster.batch = _restart_on_the_same_ports(cluster, cluster.batch)
        assert_exactly_once(client, completed(client, batch.id, 90), n)
    finally:
        cluster.stop()
