"""Importing the services turns gRPC's fork handlers off (grpc/grpc#43055) unless told otherwise.

The setting only counts if it is in the environment before gRPC is first imported: gRPC reads it
once. The benchmarks and the harness fork after they have used gRPC (worker pools; child processes
were started with a `preexec_fn`, a real fork, until services.common.process.orphan_guard), and with the handlers
on a fork can deadlock in gRPC's pre-fork handler: `bench.compare` once hung for good in `fork()`
while starting a router, its one other thread gRPC's timer. So every entry point must have set it
before anything imports grpc.
"""

import os
import subprocess
import sys

import pytest

PROBE = "import services, os; print(os.environ['GRPC_ENABLE_FORK_SUPPORT'])"

# Records the setting at the moment `grpc` is first imported, then imports the entry point.
FIRST_IMPORT_PROBE = """
import os, sys
seen = []
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "grpc" and not seen:
            seen.append(os.environ.get("GRPC_ENABLE_FORK_SUPPORT"))
        return None
sys.meta_path.insert(0, Spy())
import importlib
importlib.import_module(sys.argv[1])
print(seen[0] if seen else "no grpc")
"""


def _env() -> dict:
    return {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}


def _probe(env: dict) -> str:
    return subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_fork_support_is_off_by_default():
    assert _probe(_env()) == "false"


def test_an_explicit_setting_wins():
    assert _probe({**os.environ, "GRPC_ENABLE_FORK_SUPPORT": "true"}) == "true"


@pytest.mark.parametrize(
    "module",
    [
        "bench.compare",
        "bench.evaluate",
        "bench.scheduler_bench",
        "bench.capacity_scale",
        "services.launcher.cluster",
        "services.launcher.supervisor",
        "services.launcher.probes",
        "clients.player",
        "services.cli.up",
        "services.cli.demo",
    ],
)
def test_fork_support_is_off_before_any_entry_point_imports_grpc(module):
    out = subprocess.run(
        [sys.executable, "-c", FIRST_IMPORT_PROBE, module], env=_env(), capture_output=True, text=True, check=True
    ).stdout.strip()
    # "no grpc": the module never imports it, which is as safe.
    assert out in ("false", "no grpc"), f"{module} imports grpc before fork support is turned off (saw {out!r})"
