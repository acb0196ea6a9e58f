"""services.common.process.orphan_guard: a child that dies with its parent, started without a preexec_fn."""

import os
import signal
import subprocess
import sys

from services.common.process import orphan_guard


def test_the_guard_refuses_to_run_once_its_parent_is_gone():
    """Started on behalf of a parent that is not (or no longer) its parent, the guard exits before
    running the module: the death signal would never come."""
    result = subprocess.run(
        [sys.executable, "-m", "services.common.process.orphan_guard", "1", "tests.unit.cli.fake_service"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == orphan_guard.EXIT_PARENT_GONE
    assert "parent 1 is gone" in result.stderr


def test_the_guard_runs_the_module_as_main_with_its_arguments(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text("import sys; print(__name__, sys.argv[1:])\n")
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; from services.common.process import orphan_guard; "
            "sys.exit(subprocess.run(orphan_guard.command(sys.executable, 'probe', ['a', '--b'])).returncode)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.getcwd()])},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "__main__ ['a', '--b']"


def test_the_guard_execs_a_program_with_its_arguments(tmp_path):
    """`--exec`: a program that is not a Python module (redis-server in the benchmarks) replaces
    the guard once the death signal is set, and the signal survives the exec."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import ctypes, sys\n"
        "sig = ctypes.c_int(0)\n"
        "ctypes.CDLL(None).prctl(2, ctypes.byref(sig))  # PR_GET_PDEATHSIG\n"
        "print(sig.value, sys.argv[1:])\n"
    )
    launcher = (
        "import subprocess, sys; from services.common.process import orphan_guard; "
        f"sys.exit(subprocess.run(orphan_guard.exec_command(sys.executable, sys.executable, "
        f"[{str(probe)!r}, 'a', '--b'])).returncode)"
    )
    result = subprocess.run([sys.executable, "-c", launcher], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{int(signal.SIGTERM)} ['a', '--b']"


def test_the_guard_usage_is_checked():
    assert orphan_guard.main([]) == 2
    assert orphan_guard.main(["not-a-pid", "x"]) == 2
    assert orphan_guard.main([str(os.getppid()), "--exec"]) == 2
