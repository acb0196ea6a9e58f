"""Two clusters side by side (`bandmaster up --ports auto` and `--port-base`), as two users (or two
experiments) on one machine run them: each registers under its name, each client command with `--cluster`
reaches its own, without it they refuse naming both, a service one cluster does not run is said absent, and
a clean stop removes the temporary state dir it made."""

import json
import random
import signal
import subprocess
from pathlib import Path

from services.cli.up import PORT_BASE_OFFSETS
from services.common.serve.ports import port_free
from tests.support.processes import Process, base_env, python_module, run_module, start

UP_LINE = "Ctrl-C to stop"


def _free_block() -> int:
    """A --port-base below the ephemeral range (where `--ports auto` clusters take theirs) whose ports are free."""
    wanted = [*PORT_BASE_OFFSETS.values(), 12, 18]
    for _ in range(50):
        base = random.randrange(20_000, 30_000, 100)
        if all(port_free("127.0.0.1", base + offset) for offset in wanted):
            return base
    raise AssertionError("no free block of ports between 20000 and 30000")


def _up(tmp_path: Path, env: dict[str, str], name: str, *extra: str) -> Process:
    argv = python_module(
        "services.cli",
        "up",
        "--name",
        name,
        "--workers",
        "1",
        "--worker-kv-tokens",
        "8192",
        "--speedup",
        "20",
        "--log-level",
        "WARNING",
        *extra,
    )
    return start(f"up-{name}", argv, tmp_path, env=env)


def _cli(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    return run_module("services.cli", *argv, env=env)


def test_two_clusters_side_by_side_each_command_reaches_its_own(tmp_path):
    registry = tmp_path / "clusters"
    # No --state-dir: each makes a temporary one (under TMPDIR), removed at a clean stop.
    env = base_env(BANDMASTER_CLUSTERS_DIR=str(registry), TMPDIR=str(tmp_path))
    base = _free_block()
    with (
        _up(tmp_path, env, "alpha", "--ports", "auto") as alpha,
        _up(tmp_path, env, "beta", "--port-base", str(base), "--no-planner") as beta,
    ):
        alpha_out = alpha.wait_for_log(UP_LINE, timeout_s=120)
        beta_out = beta.wait_for_log(UP_LINE, timeout_s=120)
        assert "Bandmaster is up (cluster alpha)" in alpha_out, alpha_out
        assert "Bandmaster is up (cluster beta)" in beta_out, beta_out
        assert "bandmaster status --cluster" in alpha_out + beta_out  # the later one names the flag to use
        records = {name: json.loads((registry / f"{name}.json").read_text()) for name in ("alpha", "beta")}
        assert records["alpha"]["capacity"] != records["beta"]["capacity"]
        assert "planner" in records["alpha"] and "planner" not in records["beta"]
        # beta's ports are the block from its --port-base.
        assert records["beta"]["http_url"] == f"http://127.0.0.1:{base}"
        assert records["beta"]["capacity"] == f"127.0.0.1:{base + 1}"
        assert records["beta"]["workers"] == [f"http://127.0.0.1:{base + 50}"]
        worker = {name: r["workers"][0] for name, r in records.items()}
        for out, name in ((alpha_out, "alpha"), (beta_out, "beta")):
            # Every endpoint is printed: the worker, the HTTP API, each gRPC service and its /metrics.
            for key in ("capacity", "scheduler", "router"):
                assert records[name][key] in out, out
            assert records[name]["http_url"] in out and worker[name] in out and "/metrics" in out, out

        listed = _cli(env, "clusters")
        assert listed.returncode == 0, listed.stderr
        assert [line.split()[0] for line in listed.stdout.splitlines()[3:]] == ["alpha", "beta"], listed.stdout

        # Named, each command reaches its own cluster.
        for name, other in (("alpha", "beta"), ("beta", "alpha")):
            status = _cli(env, "status", "--once", "--cluster", name)
            assert status.returncode == 0, status.stderr
            assert f"cluster '{name}'" in status.stdout and worker[name] in status.stdout, status.stdout
            assert worker[other] not in status.stdout, status.stdout
            programs = _cli(env, "programs", "--cluster", name)
            assert programs.returncode == 0 and "replicas (1)" in programs.stdout, programs.stderr
        plan = _cli(env, "plan", "--json", "--cluster", "alpha")
        assert plan.returncode == 0, plan.stderr
        batches = _cli(env, "batch", "--cluster", "alpha", "list")
        assert batches.returncode == 0, batches.stderr

        # beta runs no planner: said so, never another cluster's (or the default) planner asked.
        status = _cli(env, "status", "--once", "--cluster", "beta")
        assert "leases: none in this cluster (started with --no-planner)" in status.stdout, status.stdout
        plan = _cli(env, "plan", "--cluster", "beta")
        assert plan.returncode == 1 and "runs no planner (started with --no-planner)" in plan.stderr, plan.stderr
        batches = _cli(env, "batch", "--cluster", "beta", "list")
        assert batches.returncode == 1 and "runs no batch service" in batches.stderr, batches.stderr

        # Unnamed, every command refuses to guess and lists both.
        for argv in (("status", "--once"), ("programs",), ("plan",), ("batch", "list")):
            refused = _cli(env, *argv)
            assert refused.returncode == 2, (argv, refused.stdout, refused.stderr)
            assert "2 clusters are running; name one with --cluster NAME" in refused.stderr, refused.stderr
            assert "\n  alpha  (state dir" in refused.stderr and "\n  beta  (state dir" in refused.stderr

        # A name in use is refused before anything starts.
        again = run_module("services.cli", "up", "--name", "alpha", "--ports", "auto", env=env)
        assert again.returncode == 1 and "a cluster named 'alpha' is already running" in again.stderr

        # beta stops cleanly: its entry and its temporary state dir go; alpha alone is found without flags.
        beta.send_signal(signal.SIGINT)
        assert beta.wait_exit(60) == 0, beta.log_text()
        assert not (registry / "beta.json").exists()
        assert not Path(records["beta"]["state_dir"]).exists(), "the temporary state dir outlived a clean stop"
        status = _cli(env, "status", "--once")
        assert status.returncode == 0 and "cluster 'alpha'" in status.stdout, status.stdout + status.stderr
        programs = _cli(env, "programs")
        assert programs.returncode == 0, programs.stderr
