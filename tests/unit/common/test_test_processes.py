"""tests/support/processes.start: what a test session starts dies with it, even when the session is
killed outright (SIGKILL, a CI timeout), and the started process keeps its own pid and exit code."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.eventually import wait_until
from tests.support.processes import ROOT, assert_child_dies_with_parent, base_env, python_module, start

# The argv the killed session starts, as source: a service (`python -m module`), and a program found
# on PATH (as redis-server is in the Redis tests).
CHILDREN = {
    "module": "python_module('tests.unit.cli.fake_service', '--ready-file', str(tmp / 'ready.json'))",
    "program": "['sleep', '600']",
}


@pytest.mark.parametrize("kind", sorted(CHILDREN))
def test_processes_a_killed_test_session_started_die_with_it(tmp_path, kind):
    pid_file = tmp_path / "child.pid"
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from tests.support.processes import python_module, start
        tmp = Path({str(tmp_path)!r})
        p = start("child", {CHILDREN[kind]}, tmp)
        Path({str(pid_file)!r}).write_text(str(p.pid))
        time.sleep(600)
    """)
    assert_child_dies_with_parent("session", script, pid_file, tmp_path, timeout_s=10)


def test_a_guarded_process_keeps_its_pid_and_exit_code(tmp_path):
    failing = python_module("tests.unit.cli.fake_service", "--ready-file", str(tmp_path / "r.json"), "--fail")
    with start("exits", failing, tmp_path) as p:
        assert p.wait_exit(30) == 3
        assert "refusing to start" in p.log_text()
    with start("sleep", ["sleep", "600"], tmp_path) as p:
        # The guard execs the program in place: the pid the test holds is the program's own.
        def argv():
            args = Path(f"/proc/{p.pid}/cmdline").read_bytes().split(b"\0")
            return [Path(args[0].decode()).name, *args[1:2]]

        wait_until(lambda: argv() == ["sleep", b"600"], timeout_s=30, message="sleep never replaced the guard")


def test_a_program_that_is_not_on_path_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(FileNotFoundError, match="no-such-program-here"):
        start("missing", ["no-such-program-here"], tmp_path)


def test_a_failed_tests_report_carries_the_log_tails_of_the_processes_it_started(tmp_path):
    """tests/conftest.py: in CI the temporary directory is gone, so the report is where a failed test's
    service logs must be; a passing test's are not printed."""
    test_file = tmp_path / "test_reported.py"
    test_file.write_text(
        textwrap.dedent("""
            from tests.support.processes import start

            def test_passes(tmp_path):
                with start("quiet", ["sh", "-c", "echo said-by-a-passing-test"], tmp_path) as p:
                    p.wait_exit(30)

            def test_fails(tmp_path):
                with start("talker", ["sh", "-c", "echo said-before-failing"], tmp_path) as p:
                    p.wait_exit(30)
                assert False, "the test's own failure"
        """)
    )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT)]
        + ["-p", "tests.conftest", "-p", "no:cacheprovider", "-q", str(test_file)],
        cwd=ROOT,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "the test's own failure" in run.stdout
    assert "log of talker" in run.stdout and "said-before-failing" in run.stdout
    assert "said-by-a-passing-test" not in run.stdout
