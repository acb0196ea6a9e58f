"""`python -m services.simworker` as a real process: ready file, stdout port line, exit codes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.support.eventually import wait_until

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("argv, fragment", [
    (["--speedup", "0"], "speedup > 0"),
    (["--timing-profile", "no-such-profile"], "no-such-profile"),
    (["--bogus"], "argv"),
])
def test_invalid_config_exits_2(argv, fragment):
    done = subprocess.run([sys.executable, "-m", "services.simworker", "--port", "0", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert fragment in done.stderr


def test_ready_file_serves_and_sigterm_stops(tmp_path):
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen([sys.executable, "-m", "services.simworker", "--port", "0", "--ready-file", str(ready),
                             "--model-name", "m", "--speedup", "50"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: ready.exists() or proc.poll() is not None, timeout_s=30)
        assert proc.poll() is None
        info = json.loads(ready.read_text())
        assert info["pid"] == proc.pid and info["port"] > 0
        url = f"http://127.0.0.1:{info['port']}"
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            assert r.status == 200
        request = urllib.request.Request(url + "/generate", data=json.dumps(
            {"text": "hi", "sampling_params": {"max_new_tokens": 2}}).encode())
        with urllib.request.urlopen(request, timeout=10) as r:
            assert json.loads(r.read())["meta_info"]["completion_tokens"] >= 1
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=15)
        assert proc.returncode == 0
        assert f"port={info['port']}" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
