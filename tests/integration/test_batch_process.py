"""`python -m services.batch` and `python -m services.planner` as real processes, dispatching a batch to a real
simworker with the official openai client.

* The batch completes at the planner's leased rate; the batch service is SIGKILLed mid-batch and restarted on
  the same registry: every request is in the output exactly once, none lost.
* No token passes through the planner: it serves no HTTP data route, and after a whole batch its store and its
  log hold none of the prompts, custom ids or completions (only ids, counts and deadlines).
* Bad configuration refuses to start (exit 2).
"""

import glob
import io
import json
import signal
import urllib.error
import urllib.request

import grpc
import openai
import pytest

from bandmaster.planner.v1 import planner_pb2 as pb
from bandmaster.planner.v1 import planner_pb2_grpc as pb_grpc
from tests.support.eventually import wait_until
from tests.support.processes import python_module, run_module, start

pytestmark = pytest.mark.integration
MODEL = "bandmaster/simworker"
MARKER = "zebra-quartz"
"""In every prompt: a string no control-plane record may contain."""


def _start(tmp_path, name, argv, ready):
    return start(name, argv, tmp_path, ready_file=ready).wait_ready(timeout_s=60)


@pytest.fixture
def simworker(tmp_path):
    ready = tmp_path / "sim.json"
    with _start(
        tmp_path,
        "simworker",
        python_module(
            "services.simworker", "--port", "0", "--ready-file", str(ready), "--speedup", "50", "--log-level", "WARNING"
        ),
        ready,
    ) as proc:
        yield f"http://127.0.0.1:{proc.ready['port']}"


def start_planner(tmp_path, *extra):
    ready = tmp_path / "planner-ready.json"
    argv = python_module(
        "services.planner",
        "--listen",
        "127.0.0.1:0",
        "--metrics-port",
        "0",
        "--registry-path",
        str(tmp_path / "planner.sqlite3"),
        "--ready-file",
        str(ready),
        "--tick-interval-seconds",
        "0.2",
        "--tick-max-duration-seconds",
        "2",
        "--observe-timeout-seconds",
        "1",
        "--effect-timeout-seconds",
        "1",
        "--drain-lease-duration-seconds",
        "10",
        "--assume-no-online-traffic",
        "--cold-start-margin-seconds",
        "0",
        "--finalization-margin-seconds",
        "0",
        "--virtual-initial-replicas",
        "1",
        "--safe-rps-per-replica",
        "50",
        *extra,
    )
    return _start(tmp_path, "planner", argv, ready)


def start_batch(tmp_path, planner_addr, dispatch_url, *extra):
    ready = tmp_path / "batch-ready.json"
    argv = python_module(
        "services.batch",
        "--listen",
        "127.0.0.1:0",
        "--metrics-port",
        "0",
        "--http-listen",
        "127.0.0.1:0",
        "--registry-path",
        str(tmp_path / "batch.sqlite3"),
        "--ready-file",
        str(ready),
        "--planner",
        planner_addr,
        "--dispatch-url",
        dispatch_url,
        "--report-interval-seconds",
        "0.2",
        *extra,
    )
    return _start(tmp_path, "batch", argv, ready)


def batch_file(n):
    lines = [
        json.dumps(
            {
                "custom_id": f"r{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"{MARKER} say {i}"}],
                    "max_tokens": 4,
                },
            }
        )
        for i in range(n)
    ]
    return ("\n".join(lines) + "\n").encode()


def _plan(address: str) -> pb.Plan:
    with grpc.insecure_channel(address) as ch:
        return pb_grpc.PlannerStub(ch).GetPlan(pb.GetPlanRequest(), timeout=5)


def _job(address: str, job_id: str) -> pb.BatchJob:
    with grpc.insecure_channel(address) as ch:
        return pb_grpc.PlannerStub(ch).GetBatchJob(pb.GetBatchJobRequest(job_id=job_id), timeout=5)


def test_a_batch_survives_a_batch_service_kill_and_no_token_passes_through_the_planner(tmp_path, simworker):
    n = 40
    planner = start_planner(tmp_path, "--max-batch-admission-rps", "8")
    batch = start_batch(tmp_path, planner.ready["grpc"], simworker)
    try:
        client = openai.OpenAI(base_url=batch.ready["http"] + "/v1", api_key="unused", max_retries=0)
        f = client.files.create(file=("in.jsonl", io.BytesIO(batch_file(n))), purpose="batch")
        created = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="1h")

        def partly_done():
            b = client.batches.retrieve(created.id)
            return b if 5 <= b.request_counts.completed < n else None

        wait_until(partly_done, timeout_s=60, interval_s=0.1)
        plan = _plan(planner.ready["grpc"])
        assert plan.observation.active_jobs == 1 and plan.leases[0].max_admission_rps == pytest.approx(8)
        assert plan.observation.feedback_known  # the batch service's reports reach the tick
        batch.kill()
        batch.wait_exit(10)

        batch = start_batch(tmp_path, planner.ready["grpc"], simworker)
        client = openai.OpenAI(base_url=batch.ready["http"] + "/v1", api_key="unused", max_retries=0)

        def done():
            b = client.batches.retrieve(created.id)
            return b if b.status == "completed" else None

        b = wait_until(done, timeout_s=90, interval_s=0.2)
        assert b.request_counts.total == n and b.request_counts.completed == n and b.request_counts.failed == 0
        lines = [json.loads(x) for x in client.files.content(b.output_file_id).text.splitlines()]
        assert sorted(x["custom_id"] for x in lines) == sorted(f"r{i}" for i in range(n))  # none lost, none twice
        assert all(x["response"]["status_code"] == 200 and x["response"]["body"]["choices"] for x in lines)
        assert b.error_file_id is None

        # The planner knows the batch as a job: counts and a deadline, closed once the batch service reported it.
        job = wait_until(
            lambda: (j := _job(planner.ready["grpc"], created.id)).status == "completed" and j, timeout_s=10
        )
        assert (job.total_requests, job.completed_requests) == (n, n) and job.deadline.seconds == b.expires_at

        # No data route on the planner: its ready file names no HTTP API, its only HTTP port serves /metrics.
        assert "http" not in planner.ready
        for path in ("/v1/batches", "/v1/files", "/v1/chat/completions"):
            with pytest.raises(urllib.error.HTTPError) as info:
                urllib.request.urlopen(f"http://127.0.0.1:{planner.ready['metrics_port']}{path}", timeout=5)
            assert info.value.code in (404, 405)
        completions = [x["response"]["body"]["choices"][0]["message"]["content"] for x in lines]
        secrets = [MARKER, "say 7", *(f'"r{i}"' for i in range(n)), *(c for c in completions if len(c) >= 8)]
    finally:
        batch.send_signal(signal.SIGTERM)
        assert batch.wait_exit(20) == 0
        planner.send_signal(signal.SIGTERM)
        assert planner.wait_exit(20) == 0
    # Its store (with the WAL) and its log hold none of the batch's content.
    stored = b"".join(open(p, "rb").read() for p in glob.glob(str(tmp_path / "planner.sqlite3*")))
    assert stored and created.id.encode() in stored
    log = (tmp_path / "planner.log").read_text()
    for text in secrets:
        assert text.encode() not in stored, text
        assert text not in log, text
    # The batch service's registry does hold them: the content lives where the tokens flow.
    assert MARKER.encode() in b"".join(open(p, "rb").read() for p in glob.glob(str(tmp_path / "batch.sqlite3*")))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--dispatch-url", "http://127.0.0.1:8000"], "--planner"),
        (["--planner", "127.0.0.1:50061"], "--dispatch-url"),
        (["--planner", "127.0.0.1:1", "--dispatch-url", "http://u:p@h:1"], "without credentials"),
    ],
)
def test_invalid_config_exits_2_naming_the_rule(argv, message):
    proc = run_module("services.batch", *argv)
    assert proc.returncode == 2 and message in proc.stderr and "invalid configuration" in proc.stderr
