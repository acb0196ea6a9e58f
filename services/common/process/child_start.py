"""Starting a child process, the one way: stdin closed, stdout and stderr to its log file.

    process = start_child(orphan_guard.command(python, module, args), log_path, env=env, cwd=cwd)
    ...
    stop_child(process, grace_s=10)          # services/common/process/child_stop.py, every wait bounded

`argv` is run as given: wrap it with `orphan_guard.command` / `exec_command` first for a child that must
die with its parent (the supervisor, the benches, the tests do). The log is appended to (a restart under
the same name keeps the earlier run's lines) unless `truncate`; `log_path=None` discards the output.
Start guarded children from a thread that lives as long as they should (see orphan_guard).
Stdlib only, no service state: `bandmaster up` (services/launcher/supervisor.py), the benches and the tests share it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Mapping, Sequence


def start_child(
    argv: Sequence[str],
    log_path: str | Path | None,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    truncate: bool = False,
    new_session: bool = False,
) -> subprocess.Popen:
    """Start `argv` with stdin from /dev/null and stdout + stderr into `log_path` (None: discarded);
    `env` None inherits this process's environment; `new_session` gives it its own process group."""
    if log_path is None:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=None if env is None else dict(env),
            cwd=cwd,
            start_new_session=new_session,
        )
    with open(log_path, "wb" if truncate else "ab") as log:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=None if env is None else dict(env),
            cwd=cwd,
            start_new_session=new_session,
        )
