"""The supervisor behind `bandmaster up`: readiness, failure reporting, and no orphans."""

import os
import textwrap

import pytest

from services.launcher.supervisor import ChildSpec, StartupError, Supervisor, grpc_serving
from tests.support.processes import assert_child_dies_with_parent, pid_alive


def test_start_wait_ready_and_stop(tmp_path):
    supervisor = Supervisor(tmp_path)
    (child,) = supervisor.start_all([ChildSpec("fake", "tests.unit.cli.fake_service", [])], timeout_s=30)
    assert grpc_serving(child.endpoint)
    pid = child.process.pid
    supervisor.stop_all(grace_s=5)
    assert not pid_alive(pid)
    assert supervisor.children == []


def test_child_that_exits_is_reported_with_its_log(tmp_path):
    supervisor = Supervisor(tmp_path)
    with pytest.raises(StartupError, match="(?s)exited with code 3.*refusing to start"):
        supervisor.start_all([ChildSpec("bad", "tests.unit.cli.fake_service", ["--fail"])], timeout_s=30)
    assert supervisor.children == []


def test_children_die_when_the_supervisor_is_killed(tmp_path):
    """Even SIGKILL of the supervising process leaves no orphan (PR_SET_PDEATHSIG, set by the child)."""
    pid_file = tmp_path / "child.pid"
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from services.launcher.supervisor import ChildSpec, Supervisor
        s = Supervisor(Path({str(tmp_path)!r}) / "state")
        (c,) = s.start_all([ChildSpec("fake", "tests.unit.cli.fake_service", [])], timeout_s=30)
        Path({str(pid_file)!r}).write_text(str(c.process.pid))
        time.sleep(600)
    """)
    assert_child_dies_with_parent("supervisor", script, pid_file, tmp_path, timeout_s=10)


def test_children_start_without_a_preexec_fn(tmp_path, monkeypatch):
    """A `preexec_fn` makes `subprocess` fork the threaded supervisor and run Python between fork
    and exec, where a lock another thread holds (gRPC's, the loader's) can deadlock the child. The
    death signal is the child's own business (services.common.process.orphan_guard)."""
    import subprocess

    seen = []
    real = subprocess.Popen

    def spy(*args, **kwargs):
        seen.append((args[0], kwargs.get("preexec_fn")))
        return real(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", spy)
    supervisor = Supervisor(tmp_path)
    supervisor.start_all([ChildSpec("fake", "tests.unit.cli.fake_service", [])], timeout_s=30)
    supervisor.stop_all(grace_s=5)
    (cmd, preexec_fn), *_ = seen
    assert preexec_fn is None
    assert cmd[1:5] == ["-m", "services.common.process.orphan_guard", str(os.getpid()), "tests.unit.cli.fake_service"]


def test_a_reused_state_dir_reports_only_this_runs_log_lines(tmp_path):
    (tmp_path / "bad.log").write_text("an earlier run: all well\n" * 30)
    supervisor = Supervisor(tmp_path)
    with pytest.raises(StartupError) as err:
        supervisor.start_all([ChildSpec("bad", "tests.unit.cli.fake_service", ["--fail"])], timeout_s=30)
    assert "refusing to start" in str(err.value)
    assert "an earlier run" not in str(err.value)
    assert (tmp_path / "bad.log").read_text().startswith("an earlier run")  # kept, only not shown
