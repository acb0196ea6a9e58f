"""`python -m services.simworker` as a real process: ready file, stdout port line, exit codes."""

from __future__ import annotations

import json
import signal
import urllib.request

import pytest

from tests.support.processes import python_module, run_module, start

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--speedup", "0"], "speedup > 0"),
        (["--timing-profile", "no-such-profile"], "no-such-profile"),
        (["--bogus"], "argv"),
    ],
)
def test_invalid_config_exits_2(argv, fragment):
    done = run_module("services.simworker", "--port", "0", *argv)
    assert done.returncode == 2
    assert fragment in done.stderr


def test_ready_file_serves_and_sigterm_stops(tmp_path):
    ready = tmp_path / "ready.json"
    with start(
        "simworker",
        python_module(
            "services.simworker", "--port", "0", "--ready-file", str(ready), "--model-name", "m", "--speedup", "50"
        ),
        tmp_path,
        ready_file=ready,
    ).wait_ready() as proc:
        info = proc.ready
        assert info["pid"] == proc.pid and info["port"] > 0
        url = f"http://127.0.0.1:{info['port']}"
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            assert r.status == 200
        request = urllib.request.Request(
            url + "/generate", data=json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 2}}).encode()
        )
        with urllib.request.urlopen(request, timeout=10) as r:
            assert json.loads(r.read())["meta_info"]["completion_tokens"] >= 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait_exit(15) == 0
        assert f"port={info['port']}" in proc.log_text()
