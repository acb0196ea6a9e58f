"""Importing the services turns gRPC's fork handlers off (grpc/grpc#43055) unless told otherwise."""

import os
import subprocess
import sys

PROBE = "import services, os; print(os.environ['GRPC_ENABLE_FORK_SUPPORT'])"


def _probe(env: dict) -> str:
    return subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_fork_support_is_off_by_default():
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    assert _probe(env) == "false"


def test_an_explicit_setting_wins():
    assert _probe({**os.environ, "GRPC_ENABLE_FORK_SUPPORT": "true"}) == "true"
