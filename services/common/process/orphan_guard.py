"""Run a Python module as `__main__`, or exec a program, in a process that dies with its parent.

    python -m services.common.process.orphan_guard PARENT_PID MODULE [ARG ...]
    python -m services.common.process.orphan_guard PARENT_PID --exec PROGRAM [ARG ...]

The child asks the kernel itself for PR_SET_PDEATHSIG (SIGTERM when its parent dies), then checks
that its parent is still PARENT_PID (the parent may have died before the call, and the child would
then wait for a death that already happened), and runs MODULE with ARGs as `python -m MODULE ARG ...`
would, or replaces itself with PROGRAM (the death signal survives exec, except into a set-user-ID
program). The supervisor starts its children this way instead of asking for the death signal from a
`preexec_fn`: a `preexec_fn` makes `subprocess` fork the whole (threaded) parent and run Python
between fork and exec, where a lock held by another thread (gRPC's, the dynamic loader's) can
deadlock the child; without one, `subprocess` runs nothing in the child before exec.

The kernel's "parent" is the thread that started the child, not its process: start guarded children
from a thread that lives as long as they should (the main thread, or the event loop's), never from a
short-lived worker thread, or they get SIGTERM when that thread ends.

Where there is no prctl (not Linux), the module runs without the death signal.
"""

from __future__ import annotations

import ctypes
import os
import runpy
import signal
import sys
from typing import Sequence

PR_SET_PDEATHSIG = 1
EXIT_PARENT_GONE = 3
USAGE = "usage: python -m services.common.process.orphan_guard PARENT_PID (MODULE | --exec PROGRAM) [ARG ...]"


def command(python: str, module: str, args: Sequence[str] = ()) -> list[str]:
    """The argv that runs `python -m module *args` under the guard, with this process as the parent."""
    return [python, "-m", __name__, str(os.getpid()), module, *args]


def exec_command(python: str, program: str, args: Sequence[str] = ()) -> list[str]:
    """The argv that execs `program *args` under the guard, with this process as the parent."""
    return [python, "-m", __name__, str(os.getpid()), "--exec", program, *args]


def set_death_signal() -> None:
    """SIGTERM this process when its parent dies (nothing where prctl does not exist)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    if prctl(PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")


def main(argv: list[str]) -> int | None:
    program = len(argv) >= 3 and argv[1] == "--exec"
    if len(argv) < 2 or not argv[0].isdigit() or (argv[1] == "--exec" and not program):
        print(USAGE, file=sys.stderr)
        return 2
    parent = int(argv[0])
    target = argv[2] if program else argv[1]
    set_death_signal()
    if os.getppid() != parent:
        print(f"orphan_guard: parent {parent} is gone before {target} started", file=sys.stderr)
        return EXIT_PARENT_GONE
    if program:
        os.execv(target, [target, *argv[3:]])  # raises OSError if it cannot; never returns otherwise
    sys.argv = [target, *argv[2:]]
    runpy.run_module(target, run_name="__main__", alter_sys=True)
    return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
