"""The committed generated code must be exactly what the pinned grpcio-tools produces."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_generated_protobuf_code_is_up_to_date():
    result = subprocess.run(
        [sys.executable, "scripts/gen_protos.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_generated_modules_import():
    from bandmaster.capacity.v1 import capacity_pb2_grpc
    from bandmaster.planner.v1 import planner_pb2_grpc
    from bandmaster.router.v1 import router_pb2_grpc
    from bandmaster.scheduler.v1 import scheduler_pb2_grpc

    assert capacity_pb2_grpc.CapacityStub
    assert scheduler_pb2_grpc.SchedulerStub
    assert router_pb2_grpc.RouterStub
    assert planner_pb2_grpc.PlannerStub
