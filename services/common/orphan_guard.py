"""Run a Python module as `__main__` in a process that dies with its parent.

    python -m services.common.orphan_guard PARENT_PID MODULE [ARG ...]

The child asks the kernel itself for PR_SET_PDEATHSIG (SIGTERM when its parent dies), then checks
that its parent is still PARENT_PID (the parent may have died before the call, and the child would
then wait for a death that already happened), and runs MODULE with ARGs as `python -m MODULE ARG ...`
would. The supervisor starts its children this way instead of asking for the death signal from a
`preexec_fn`: a `preexec_fn` makes `subprocess` fork the whole (threaded) parent and run Python
between fork and exec, where a lock held by another thread (gRPC's, the dynamic loader's) can
deadlock the child; without one, `subprocess` runs nothing in the child before exec.

Where there is no prctl (not Linux), the module runs without the death signal.
"""

from __future__ import annotations

import ctypes
import os
import runpy
import signal
import sys

PR_SET_PDEATHSIG = 1
EXIT_PARENT_GONE = 3
USAGE = "usage: python -m services.common.orphan_guard PARENT_PID MODULE [ARG ...]"


def command(python: str, module: str, args: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The argv that runs `python -m module *args` under the guard, with this process as the parent."""
    return [python, "-m", __name__, str(os.getpid()), module, *args]


def set_death_signal() -> bool:
    """SIGTERM this process when its parent dies; False where prctl does not exist."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return False
    if prctl(PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")
    return True


def main(argv: list[str]) -> int | None:
    if len(argv) < 2 or not argv[0].isdigit():
        print(USAGE, file=sys.stderr)
        return 2
    parent, module = int(argv[0]), argv[1]
    set_death_signal()
    if os.getppid() != parent:
        print(f"orphan_guard: parent {parent} is gone before {module} started", file=sys.stderr)
        return EXIT_PARENT_GONE
    sys.argv = [module, *argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
