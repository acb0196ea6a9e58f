"""Issue 21 (edges), end to end with real processes: a worker started with --api-key (the simworker, as
SGLang) refuses a request without the key; `bandmaster up --worker-url ... --worker-api-key-file ...`
hands the key to the capacity service and the router, which pass it through, so the worker turns healthy
and a chat completion through the router succeeds; the key is on no command line and in no log."""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support.processes import python_module, run_module, start

pytestmark = pytest.mark.integration

KEY = "sk-e2e-worker-key-0123456789"
UP_LINE = "Ctrl-C to stop"


def _start_keyed_worker(tmp_path: Path):
    ready = tmp_path / "worker.ready.json"
    return start(
        "keyed-worker",
        python_module(
            "services.simworker",
            "--port",
            "0",
            "--ready-file",
            str(ready),
            "--served-model-name",
            "m",
            "--speedup",
            "50",
            "--api-key",
            KEY,
        ),
        tmp_path,
        ready_file=ready,
    )


def _post(url: str, body: dict, headers: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def _up_args(tmp_path: Path, worker_url: str, *extra: str) -> list[str]:
    return [
        "up",
        "--worker-url",
        worker_url,
        "--ports",
        "auto",
        "--no-planner",
        "--no-scheduler",
        "--healthy-timeout-seconds",
        "5",
        "--state-dir",
        str(tmp_path / "state"),
        *extra,
    ]


def test_the_key_passes_through_capacity_and_the_router_end_to_end(tmp_path):
    key_file = tmp_path / "worker.key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    with _start_keyed_worker(tmp_path).wait_ready() as worker:
        worker_url = f"http://127.0.0.1:{worker.ready['port']}"
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        status, body = _post(worker_url + "/v1/chat/completions", chat)
        assert (status, body) == (401, {"error": "Unauthorized"})  # the worker alone refuses a keyless call

        with start(
            "bandmaster-up",
            python_module("services.cli", *_up_args(tmp_path, worker_url, "--worker-api-key-file", str(key_file))),
            tmp_path,
        ) as up:
            output = up.wait_for_log(UP_LINE, timeout_s=60)
            assert "NO HEALTHY WORKER" not in output, output
            http_url = json.loads((tmp_path / "state" / "cluster.json").read_text())["http_url"]
            status, body = _post(http_url + "/v1/chat/completions", chat)
            assert status == 200, body
            assert body["choices"][0]["message"]["role"] == "assistant"

            state = tmp_path / "state"
            for ready in state.glob("*.ready.json"):
                pid = json.loads(ready.read_text())["pid"]
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                assert KEY.encode() not in cmdline, ready.name  # in the environment, never on a command line
            up.send_signal(signal.SIGTERM)
            assert up.wait_exit(60) == 0
        logs = [p.read_text(errors="replace") for p in (*state.glob("*.log"), tmp_path / "bandmaster-up.log")]
        assert logs and not any(KEY in text for text in logs)


def test_without_the_key_the_worker_never_turns_healthy_and_up_says_why(tmp_path):
    with _start_keyed_worker(tmp_path).wait_ready() as worker:
        worker_url = f"http://127.0.0.1:{worker.ready['port']}"
        result = run_module("services.cli", *_up_args(tmp_path, worker_url), timeout_s=60)
        assert result.returncode == 1, result.stdout + result.stderr
        assert "NO HEALTHY WORKER" in result.stderr and worker_url in result.stderr, result.stderr
        capacity_log = (tmp_path / "state" / "capacity.log").read_text()
        assert "/server_info: HTTP 401 (no worker API key given: --worker-api-key-file)" in capacity_log
