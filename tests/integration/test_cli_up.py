"""`bandmaster up` as a user starts it: real child processes, readiness, endpoints, clean stop, no orphans."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc

from bandmaster.capacity.v1 import capacity_pb2, capacity_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"


def _wait(predicate, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_up_serves_and_stops_without_orphans(tmp_path):
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "up", "--workers", "2", "--worker-kv-tokens", "8192",
         "--speedup", "20", "--http-port", "0", "--state-dir", str(state)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        lines = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "Ctrl-C to stop" in line:
                break
        output = "".join(lines)
        assert "Bandmaster is up" in output, output
        assert "capacity" in output and "worker[1]" in output, output

        ready = {p.name: json.loads(p.read_text()) for p in state.glob("*.ready.json")}
        assert set(ready) >= {"capacity.ready.json", "scheduler.ready.json", "router.ready.json",
                              "simworker-0.ready.json", "simworker-1.ready.json"}
        child_pids = [r["pid"] for r in ready.values()]
        assert all(_alive(pid) for pid in child_pids)

        with grpc.insecure_channel(ready["capacity.ready.json"]["grpc"]) as channel:
            stub = capacity_pb2_grpc.CapacityStub(channel)

            def two_healthy():
                snapshot = stub.ListWorkers(capacity_pb2.ListWorkersRequest(), timeout=5)
                return sum(w.health == capacity_pb2.WORKER_HEALTH_HEALTHY for w in snapshot.workers) == 2

            assert _wait(two_healthy, 30)

        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, rest
        assert "Bandmaster stopped." in rest
        assert _wait(lambda: not any(_alive(pid) for pid in child_pids), 10), "children outlived `bandmaster up`"
        # The scheduler kept its table in the state dir (recovered by the next `up` on it).
        assert (state / "scheduler-state.sqlite").is_file()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_up_refuses_invalid_options_naming_the_rule():
    result = subprocess.run([sys.executable, "-m", "services.cli", "up", "--workers", "1", "--speedup", "0"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "worker_speedup > 0" in result.stderr


def test_up_reports_a_child_that_cannot_start(tmp_path):
    # An unknown timing profile is refused by the simulated worker itself (exit 2).
    result = subprocess.run(
        [sys.executable, "-m", "services.cli", "up", "--workers", "1", "--worker-kv-tokens", "64",
         "--worker-page-size", "64", "--state-dir", str(tmp_path), "--timing-profile", "no-such-profile"],
        cwd=ROOT, capture_output=True, text=True, timeout=90,
    )
    assert result.returncode == 1
    assert "simworker-0 exited with code 2" in result.stderr
    assert not any(_alive(int(json.loads(p.read_text())["pid"])) for p in Path(tmp_path).glob("*.ready.json"))
