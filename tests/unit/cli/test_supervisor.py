"""The supervisor behind `bandmaster up`: readiness, failure reporting, and no orphans."""

import sys
import textwrap

import pytest

from harness.supervisor import ChildSpec, StartupError, Supervisor, grpc_serving
from tests.support.eventually import wait_until
from tests.support.processes import pid_alive, start


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
    """Even SIGKILL of the supervising process leaves no orphan (PR_SET_PDEATHSIG)."""
    pid_file = tmp_path / "child.pid"
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from harness.supervisor import ChildSpec, Supervisor
        s = Supervisor(Path({str(tmp_path)!r}) / "state")
        (c,) = s.start_all([ChildSpec("fake", "tests.unit.cli.fake_service", [])], timeout_s=30)
        Path({str(pid_file)!r}).write_text(str(c.process.pid))
        time.sleep(600)
    """)
    with start("supervisor", [sys.executable, "-c", script], tmp_path) as parent:
        wait_until(
            lambda: pid_file.exists() and pid_file.read_text().strip(),
            timeout_s=30,
            message="supervisor did not start its child",
        )
        child_pid = int(pid_file.read_text())
        assert pid_alive(child_pid)
        parent.kill()
        parent.wait_exit()
        wait_until(lambda: not pid_alive(child_pid), timeout_s=10, message="child outlived its supervisor")


def test_the_death_signal_hook_loads_nothing_between_fork_and_exec(monkeypatch):
    """`die_with_parent` runs in the forked child of a process with threads, where a dlopen can
    deadlock on the loader's lock: libc is loaded at import, and the hook only calls prctl."""
    import ctypes

    from harness import supervisor

    def no_dlopen(*args, **kwargs):
        raise AssertionError("die_with_parent loaded a library after fork")

    monkeypatch.setattr(ctypes, "CDLL", no_dlopen)
    supervisor.die_with_parent()  # in this (test) process: sets its own death signal, harmless
