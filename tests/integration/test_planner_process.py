"""`python -m services.planner` as a real process: leases in Redis (and after Redis restarts empty), the local
connector, and bad configuration or an unreachable Redis refusing to start. Batches through a real batch service
process are in test_batch_process.py.
"""

import signal
import time

import grpc
import pytest

from bandmaster.planner.v1 import planner_pb2 as pb
from bandmaster.planner.v1 import planner_pb2_grpc as pb_grpc
from tests.support.eventually import wait_until
from tests.support.processes import free_port, python_module, run_module, start
from tests.support.redis_server import redis_server  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


def _start(tmp_path, name, argv, ready):
    return start(name, argv, tmp_path, ready_file=ready).wait_ready(timeout_s=60)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--max-replicas", "0"], "max_replicas >= max(1, min_replicas)"),
        (["--lease-store", "redis"], "--redis-url is required"),
        (["--bogus"], "unrecognized arguments"),
        (["--dispatch-url", "http://127.0.0.1:8000"], "unrecognized arguments"),
    ],
)
def test_invalid_config_exits_2_naming_the_rule(argv, message):
    proc = run_module("services.planner", *argv)
    assert proc.returncode == 2 and message in proc.stderr and "invalid configuration" in proc.stderr


def test_unreachable_redis_refuses_to_start(tmp_path):
    port = free_port()
    proc = run_module(
        "services.planner",
        "--lease-store",
        "redis",
        "--redis-url",
        f"redis://:hunter2@127.0.0.1:{port}/0",
        "--registry-path",
        str(tmp_path / "r.sqlite3"),
        "--listen",
        "127.0.0.1:0",
        "--metrics-port",
        "-1",
        "--redis-connect-timeout-seconds",
        "0.5",
        "--redis-socket-timeout-seconds",
        "0.5",
    )
    assert proc.returncode == 2
    assert "unreachable at start-up, refusing to start" in proc.stderr and "hunter2" not in proc.stderr


def _planner_cmd(tmp_path, ready, *extra, tick_max_s="3", effect_s="2", lease_s="20"):
    return python_module(
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
        tick_max_s,
        "--observe-timeout-seconds",
        "1",
        "--effect-timeout-seconds",
        effect_s,
        "--drain-lease-duration-seconds",
        lease_s,
        "--assume-no-online-traffic",
        "--cold-start-margin-seconds",
        "0",
        "--finalization-margin-seconds",
        "0",
        *extra,
    )


def _submit(address, total=100, job_id="ext-1"):
    from google.protobuf.timestamp_pb2 import Timestamp

    deadline = Timestamp()
    deadline.FromSeconds(int(time.time()) + 600)
    with grpc.insecure_channel(address) as ch:
        return pb_grpc.PlannerStub(ch).SubmitBatchJob(
            pb.SubmitBatchJobRequest(total_requests=total, deadline=deadline, job_id=job_id), timeout=5
        )


def test_redis_lease_store_process(tmp_path, redis_server):
    import redis as redis_lib

    r = redis_lib.Redis(port=redis_server.port, decode_responses=True)
    ready = tmp_path / "ready.json"
    proc = _start(
        tmp_path,
        "planner",
        _planner_cmd(
            tmp_path,
            ready,
            "--lease-store",
            "redis",
            "--redis-url",
            redis_server.url,
            "--virtual-initial-replicas",
            "2",
            "--safe-rps-per-replica",
            "5",
            "--redis-connect-timeout-seconds",
            "0.5",
            "--redis-socket-timeout-seconds",
            "0.5",
        ),
        ready,
    )
    try:
        info = proc.ready
        key = "bandmaster:drain-limit:default"
        assert r.hget(key, "writer_epoch") == "1"
        _submit(info["grpc"])
        wait_until(lambda: float(r.hget(key, "max_admission_rps") or 0) == 10.0, timeout_s=20)
        assert 0 < r.pttl(key) <= 20_000
        assert r.hget("{" + key + "}:planner-writer-fence", "epoch") == "1"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait_exit(20) == 0
    assert r.hget(key, "max_admission_rps") == "0" and r.hget(key, "decision_id").startswith("planner-shutdown-")


def _plan(address: str) -> pb.Plan:
    with grpc.insecure_channel(address) as ch:
        return pb_grpc.PlannerStub(ch).GetPlan(pb.GetPlanRequest(), timeout=5)


def _tick_of(decision_id: str) -> int:
    return int(decision_id.rsplit("-", 1)[1])  # d-<wall>-<tick>


def test_redis_restarted_empty_leases_flow_again_within_two_ticks(tmp_path, redis_server):
    """Issue 21: Redis restarted without its data took the writer fence with it, and every lease write
    was refused as stale until the planner restarted, with no sign of failing closed."""
    import redis as redis_lib

    r = redis_lib.Redis(port=redis_server.port, decode_responses=True)
    key = "bandmaster:drain-limit:default"
    ready = tmp_path / "ready.json"
    proc = _start(
        tmp_path,
        "planner",
        _planner_cmd(
            tmp_path,
            ready,
            "--lease-store",
            "redis",
            "--redis-url",
            redis_server.url,
            "--virtual-initial-replicas",
            "2",
            "--safe-rps-per-replica",
            "5",
            "--redis-connect-timeout-seconds",
            "0.3",
            "--redis-socket-timeout-seconds",
            "0.3",
        ),
        ready,
    )
    try:
        address = proc.ready["grpc"]
        _submit(address)
        wait_until(lambda: float(r.hget(key, "max_admission_rps") or 0) == 10.0, timeout_s=20)
        redis_server.stop()

        def failing_closed():
            plan = _plan(address)
            return "lease_unknown" in plan.fail_closed_reasons and plan.effects_outcome == "lease_unknown"

        wait_until(failing_closed, timeout_s=20)
        redis_server.start()  # on the same port, empty
        r = redis_lib.Redis(port=redis_server.port, decode_responses=True)
        last_tick_before = _tick_of(_plan(address).decision_id)
        wait_until(lambda: float(r.hget(key, "max_admission_rps") or 0) == 10.0, timeout_s=20)
        written_by = _tick_of(r.hget(key, "decision_id"))
        assert written_by - last_tick_before <= 2, (last_tick_before, written_by)
        wait_until(lambda: not _plan(address).fail_closed_reasons, timeout_s=10)
        log = proc.log_text()
        assert "re-established it from writer epoch 1" in log
        assert log.count("failing closed: no further effects") == 1  # once, then DEBUG per tick
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait_exit(20) == 0


def test_local_connector_scales_from_zero_and_registers_with_capacity(tmp_path):
    from bandmaster.capacity.v1 import capacity_pb2 as cpb
    from bandmaster.capacity.v1 import capacity_pb2_grpc as cpb_grpc

    cap_ready = tmp_path / "capacity.json"
    capacity = start(
        "capacity",
        python_module(
            "services.capacity",
            "--listen",
            "127.0.0.1:0",
            "--metrics-port",
            "-1",
            "--poll-interval-seconds",
            "0.5",
            "--poll-timeout-seconds",
            "0.5",
            "--ready-file",
            str(cap_ready),
        ),
        tmp_path,
        ready_file=cap_ready,
    )
    planner = None
    try:
        cap = capacity.wait_ready(timeout_s=60).ready["grpc"]
        ready = tmp_path / "ready.json"
        planner = _start(
            tmp_path,
            "planner",
            _planner_cmd(
                tmp_path,
                ready,
                "--connector",
                "local",
                "--capacity",
                cap,
                "--local-worker-arg=--speedup",
                "--local-worker-arg=50",
                "--local-worker-arg=--log-level",
                "--local-worker-arg=WARNING",
                "--safe-rps-per-replica",
                "5",
                "--max-replicas",
                "2",
            ),
            ready,
        )
        info = planner.ready
        _submit(info["grpc"], total=50)

        def healthy_worker():
            with grpc.insecure_channel(cap) as ch:
                snap = cpb_grpc.CapacityStub(ch).ListWorkers(cpb.ListWorkersRequest(), timeout=5)
            return [
                w for w in snap.workers if w.health == cpb.WORKER_HEALTH_HEALTHY and w.worker_id.startswith("local-")
            ]

        workers = wait_until(healthy_worker, timeout_s=60, interval_s=0.2)
        assert len(workers) >= 1

        def positive_lease():
            with grpc.insecure_channel(info["grpc"]) as ch:
                return pb_grpc.PlannerStub(ch).GetLease(pb.GetLeaseRequest(), timeout=5).max_admission_rps > 0

        wait_until(positive_lease, timeout_s=30, interval_s=0.2)
    finally:
        if planner is not None:
            planner.send_signal(signal.SIGTERM)
            assert planner.wait_exit(30) == 0
        capacity.stop(grace_s=20)
