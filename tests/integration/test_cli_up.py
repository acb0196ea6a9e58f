"""`bandmaster up` as a user starts it: real child processes, readiness, endpoints, clean stop, no orphans;
its registry entry found by `bandmaster status` and `programs`; a taken port and a fleet without a healthy
worker said plainly. Every cluster here runs on `--ports auto` so that tests never collide."""

import json
import signal
import socket
import subprocess
from pathlib import Path

import grpc

from bandmaster.capacity.v1 import capacity_pb2, capacity_pb2_grpc
from tests.support.eventually import wait_until
from tests.support.processes import base_env, pid_alive, python_module, run_module, start

UP_LINE = "Ctrl-C to stop"


def _env(registry: Path) -> dict[str, str]:
    """An environment whose cluster registry is `registry` (this test's clusters only)."""
    return base_env(BANDMASTER_CLUSTERS_DIR=str(registry))


def _cli(*argv: str, registry: Path) -> subprocess.CompletedProcess:
    return run_module("services.cli", *argv, env=_env(registry))


def test_up_serves_and_stops_without_orphans(tmp_path):
    state = tmp_path / "state"
    registry = tmp_path / "clusters"
    with start(
        "bandmaster-up",
        python_module(
            "services.cli",
            "up",
            "--workers",
            "2",
            "--worker-kv-tokens",
            "8192",
            "--speedup",
            "20",
            "--ports",
            "auto",
            "--state-dir",
            str(state),
        ),
        tmp_path,
        env=_env(registry),
    ) as proc:
        output = proc.wait_for_log(UP_LINE, timeout_s=90)
        assert "Bandmaster is up" in output, output
        assert "NO HEALTHY WORKER" not in output, output
        assert "capacity" in output and "worker[1]" in output, output

        ready = {p.name: json.loads(p.read_text()) for p in state.glob("*.ready.json")}
        assert set(ready) >= {
            "capacity.ready.json",
            "scheduler.ready.json",
            "router.ready.json",
            "simworker-0.ready.json",
            "simworker-1.ready.json",
        }
        child_pids = [r["pid"] for r in ready.values()]
        assert all(pid_alive(pid) for pid in child_pids)

        with grpc.insecure_channel(ready["capacity.ready.json"]["grpc"]) as channel:
            stub = capacity_pb2_grpc.CapacityStub(channel)

            def two_healthy():
                snapshot = stub.ListWorkers(capacity_pb2.ListWorkersRequest(), timeout=5)
                return sum(w.health == capacity_pb2.WORKER_HEALTH_HEALTHY for w in snapshot.workers) == 2

            wait_until(two_healthy, timeout_s=30, interval_s=0.1)

        # The cluster is registered under its default name, its record in its state dir too: the client
        # commands find it without flags.
        assert "Bandmaster is up (cluster default)" in output, output
        record = json.loads((registry / "default.json").read_text())
        assert record["capacity"] == ready["capacity.ready.json"]["grpc"] and record["state_dir"] == str(state)
        assert json.loads((state / "cluster.json").read_text()) == record
        status = _cli("status", "--once", registry=registry)
        assert status.returncode == 0, status.stderr
        assert "workers (2 of 2 healthy" in status.stdout and "utilisation" in status.stdout, status.stdout
        assert "drain leases (1)" in status.stdout, status.stdout
        programs = _cli("programs", registry=registry)
        assert programs.returncode == 0 and "replicas (2)" in programs.stdout, programs.stderr

        proc.send_signal(signal.SIGTERM)
        proc.wait_exit(60)
        rest = proc.log_text()
        assert proc.returncode == 0, rest
        assert "Bandmaster stopped." in rest
        assert not (registry / "default.json").exists(), "the registry entry outlived its cluster"
        assert not (state / "cluster.json").exists(), "the state dir's record outlived its cluster"
        assert (state / "capacity.log").exists(), "a --state-dir the user named is kept"
        wait_until(
            lambda: not any(pid_alive(pid) for pid in child_pids),
            timeout_s=10,
            interval_s=0.1,
            message="children outlived `bandmaster up`",
        )
        # The scheduler kept its table in the state dir (recovered by the next `up` on it).
        assert (state / "scheduler-state.sqlite").is_file()


def test_up_refuses_invalid_options_naming_the_rule():
    result = run_module("services.cli", "up", "--workers", "1", "--speedup", "0")
    assert result.returncode == 2
    assert "worker_speedup > 0" in result.stderr


def test_up_reports_a_child_that_cannot_start(tmp_path):
    # An unknown timing profile is refused by the simulated worker itself (exit 2).
    result = run_module(
        "services.cli",
        "up",
        "--workers",
        "1",
        "--worker-kv-tokens",
        "64",
        "--worker-page-size",
        "64",
        "--state-dir",
        str(tmp_path),
        "--timing-profile",
        "no-such-profile",
        "--ports",
        "auto",
        timeout_s=90,
    )
    assert result.returncode == 1
    assert "simworker-0 exited with code 2" in result.stderr
    assert not any(pid_alive(int(json.loads(p.read_text())["pid"])) for p in Path(tmp_path).glob("*.ready.json"))


def test_up_on_a_taken_port_says_which_and_the_flag_that_moves_it(tmp_path, taken_port):
    result = run_module(
        "services.cli",
        "up",
        "--workers",
        "1",
        "--ports",
        "auto",
        "--scheduler-port",
        str(taken_port),
        "--state-dir",
        str(tmp_path / "state"),
    )
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"bandmaster up: port {taken_port} (scheduler gRPC) is already in use; choose "
        "another with --scheduler-port (or --ports auto)"
    )
    assert not list((tmp_path / "state").glob("*.ready.json")), "children were started"


def _unreachable_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_up_with_worker_urls_requires_a_healthy_worker_and_names_the_failing_one(tmp_path):
    url = _unreachable_url()
    result = run_module(
        "services.cli",
        "up",
        "--worker-url",
        url,
        "--ports",
        "auto",
        "--no-planner",
        "--healthy-timeout-seconds",
        "5",
        "--state-dir",
        str(tmp_path / "state"),
        timeout_s=90,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Bandmaster is up" not in result.stdout
    assert "NO HEALTHY WORKER" in result.stderr and "--require-healthy" in result.stderr, result.stderr
    worker_line = next(line for line in result.stderr.splitlines() if url in line)
    assert "pending" in worker_line or "unhealthy" in worker_line, worker_line
    assert not (tmp_path / "state" / "cluster.json").exists()


def test_up_without_a_healthy_worker_warns_loudly_and_keeps_running(tmp_path):
    url = _unreachable_url()
    registry = tmp_path / "clusters"
    with start(
        "bandmaster-up",
        python_module(
            "services.cli",
            "up",
            "--worker-url",
            url,
            "--no-require-healthy",
            "--ports",
            "auto",
            "--no-planner",
            "--healthy-timeout-seconds",
            "2",
            "--state-dir",
            str(tmp_path / "state"),
        ),
        tmp_path,
        env=_env(registry),
    ) as proc:
        output = proc.wait_for_log(UP_LINE, timeout_s=90)
        assert "NO HEALTHY WORKER" in output and url in output, output
        assert "Bandmaster is up WITHOUT A HEALTHY WORKER" in output, output
        status = _cli("status", "--once", registry=registry)
        assert status.returncode == 0 and "NO HEALTHY WORKER" in status.stdout, status.stdout + status.stderr
        proc.send_signal(signal.SIGTERM)
        proc.wait_exit(60)
        assert proc.returncode == 0


def test_up_and_status_name_a_worker_without_cache_reports_and_the_flag_to_add(tmp_path):
    registry = tmp_path / "clusters"
    with start(
        "bandmaster-up",
        python_module(
            "services.cli",
            "up",
            "--workers",
            "1",
            "--no-worker-cache-report",
            "--no-planner",
            "--speedup",
            "20",
            "--ports",
            "auto",
            "--state-dir",
            str(tmp_path / "state"),
        ),
        tmp_path,
        env=_env(registry),
    ) as proc:
        output = proc.wait_for_log(UP_LINE, timeout_s=90)
        assert "DEGRADED: 1 of 1 workers" in output, output
        assert "cache reports off; restart it with --enable-cache-report" in output, output
        assert "priority scheduling off" not in output, output  # the simulated workers run with it
        status = _cli("status", "--once", registry=registry)
        assert status.returncode == 0, status.stderr
        assert "DEGRADED: 1 of 1 workers" in status.stdout and "--enable-cache-report" in status.stdout
        proc.send_signal(signal.SIGINT)
        assert proc.wait_exit(60) == 0
