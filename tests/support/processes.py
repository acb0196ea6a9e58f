"""The one way tests run a real process: services (`python -m services.X`), stubs, redis-server, `bandmaster up`.

    proc = start("capacity", python_module("services.capacity", ..., "--ready-file", str(ready)), tmp_path,
                 ready_file=ready).wait_ready()               # or: await start(...).wait_ready_async()
    proc.ready["grpc"]; proc.log_text(); proc.send_signal(signal.SIGSTOP); assert proc.wait_exit(20) == 0
    proc.stop()                                                # or: await proc.stop_async(); or `with start(...)`

stdout and stderr go to `<tmp>/<name>.log` (appended: a restart under the same name keeps the earlier run's
lines, `log_text()` shows this run's). Every wait is bounded and fails with the process's log tail, and a
process that fails to become ready is killed. `stop` is SIGTERM (and SIGCONT, for a process a test froze),
then SIGKILL after `grace_s`. One-shot commands that must exit (`--help`, exit code 2) use `run_module`.
Processes run under `services.common.process.orphan_guard`, so a test session killed outright takes them along.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from services.common.process import orphan_guard
from services.common.process.child_start import start_child
from services.common.process.ready import read_ready_file
from tests.support.eventually import assert_eventually, wait_until

ROOT = Path(__file__).resolve().parents[2]
STOP_GRACE_S = 15.0
_started: list[Process] = []


_registry: list[str] = []


def session_clusters_dir() -> str:
    """The cluster registry of this test session (`bandmaster up` registers there, the client commands look
    there), so that tests neither see nor join the clusters of the user running them. Removed at exit."""
    if not _registry:
        _registry.append(tempfile.mkdtemp(prefix="bandmaster-test-clusters-"))
        atexit.register(shutil.rmtree, _registry[0], True)
    return _registry[0]


def base_env(**extra: str) -> dict[str, str]:
    """The test process's environment without any service configuration, the repository on PYTHONPATH, and
    the session's own cluster registry (`session_clusters_dir`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BANDMASTER_", "SIMWORKER_", "DYN_", "OTEL_"))}
    env["PYTHONPATH"] = str(ROOT)
    env["BANDMASTER_CLUSTERS_DIR"] = session_clusters_dir()
    env.update(extra)
    return env


def python_module(module: str, *args: str) -> list[str]:
    """The argv of `python -m module args...` with the interpreter running the tests."""
    return [sys.executable, "-m", module, *args]


def run_module(
    module: str, *args: str, env: dict[str, str] | None = None, cwd: Path = ROOT, timeout_s: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """`python -m module args...` to its exit, output captured as text (for exit codes and --help)."""
    return subprocess.run(
        python_module(module, *args),
        cwd=cwd,
        env=base_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def free_port() -> int:
    """A loopback TCP port free right now (for a flag that takes no 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pid_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, exited but not yet reaped, counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"


class ProcessError(RuntimeError):
    """A process exited, or did not get ready in time: names it and carries its log tail.

    Not an AssertionError, so that a poll helper does not retry it."""


class Process:
    """One child process and its log; waits are sync (`wait_*`) or async (`wait_*_async`)."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        popen: subprocess.Popen,
        log_path: Path,
        log_offset: int,
        ready_file: Path | None,
    ) -> None:
        self.name = name
        self.argv = argv
        self.popen = popen
        self.log_path = log_path
        self._log_offset = log_offset
        self.ready_file = ready_file
        self.ready: dict[str, Any] = {}

    # ---------------------------------------------------------------- state

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        """None while it runs (polls: always current)."""
        return self.popen.poll()

    @property
    def running(self) -> bool:
        return self.returncode is None

    def log_text(self) -> str:
        """What this run wrote to stdout and stderr so far."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def _failure(self, what: str) -> ProcessError:
        return ProcessError(
            f"{self.name} {what} (command: {' '.join(self.argv)})\n"
            f"--- {self.name} log tail ({self.log_path}) ---\n{self.log_tail()}"
        )

    # ---------------------------------------------------------------- waits

    def _check(self, check: Callable[[], Any], what: str) -> Callable[[], Any]:
        def alive_and_checked():
            if self.returncode is not None:
                raise self._failure(f"exited with {self.returncode} before {what}")
            return check()

        return alive_and_checked

    def _gave_up(self, error: Exception, timeout_s: float, what: str) -> ProcessError:
        self.kill()
        if isinstance(error, ProcessError):
            return error
        return self._failure(f"not ready in {timeout_s:g} s: {what} did not happen")

    def wait_for(
        self,
        check: Callable[[], Any],
        *,
        timeout_s: float = 30.0,
        what: str = "the condition held",
        interval_s: float = 0.05,
    ) -> Any:
        """Poll `check` until truthy, while the process runs; return its value. On exit or timeout the
        process is killed and ProcessError raised with its log tail."""
        try:
            return wait_until(self._check(check, what), timeout_s=timeout_s, interval_s=interval_s)
        except (AssertionError, ProcessError) as error:
            raise self._gave_up(error, timeout_s, what) from None

    async def wait_for_async(
        self,
        check: Callable[[], Any],
        *,
        timeout_s: float = 30.0,
        what: str = "the condition held",
        interval_s: float = 0.05,
    ) -> Any:
        """`wait_for` for async tests (`check` may be async)."""
        try:
            return await assert_eventually(self._check(check, what), timeout_s=timeout_s, interval_s=interval_s)
        except (AssertionError, ProcessError) as error:
            raise self._gave_up(error, timeout_s, what) from None

    def _read_ready(self) -> dict[str, Any] | None:
        assert self.ready_file is not None, f"{self.name} was started without a ready file"
        ready = read_ready_file(self.ready_file)
        if ready is None:
            return None
        self.ready = ready
        return ready

    def wait_ready(self, timeout_s: float = 30.0) -> Process:
        """Wait for the ready file; its JSON is then `self.ready`."""
        self.wait_for(self._read_ready, timeout_s=timeout_s, what=f"writing {self.ready_file}")
        return self

    async def wait_ready_async(self, timeout_s: float = 30.0) -> Process:
        await self.wait_for_async(self._read_ready, timeout_s=timeout_s, what=f"writing {self.ready_file}")
        return self

    def _log_through(self, text: str) -> str | None:
        log = self.log_text()
        at = log.find(text)
        if at < 0:
            return None
        end = log.find("\n", at)
        return log if end < 0 else log[: end + 1]

    def wait_for_log(self, text: str, timeout_s: float = 30.0) -> str:
        """Wait until the log holds `text`; return the log through the line that holds it."""
        return self.wait_for(lambda: self._log_through(text), timeout_s=timeout_s, what=f"logging {text!r}")

    async def wait_for_log_async(self, text: str, timeout_s: float = 30.0) -> str:
        return await self.wait_for_async(lambda: self._log_through(text), timeout_s=timeout_s, what=f"logging {text!r}")

    def wait_exit(self, timeout_s: float | None = None) -> int:
        """Its exit code; raises subprocess.TimeoutExpired past `timeout_s`."""
        return self.popen.wait(timeout_s)

    async def wait_exit_async(self, timeout_s: float | None = None) -> int:
        """Its exit code; raises TimeoutError past `timeout_s`."""
        try:
            await assert_eventually(
                lambda: self.returncode is not None, timeout_s=timeout_s or float("inf"), interval_s=0.02
            )
        except AssertionError:
            raise TimeoutError(f"{self.name} still running after {timeout_s:g} s") from None
        return self.popen.wait()

    # ---------------------------------------------------------------- signals and stop

    def send_signal(self, sig: int) -> None:
        if self.running:
            self.popen.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL: no shutdown path runs."""
        self.send_signal(signal.SIGKILL)

    def _terminate(self) -> None:
        self.send_signal(signal.SIGTERM)
        self.send_signal(signal.SIGCONT)  # a stopped process acts on SIGTERM only once continued

    def stop(self, grace_s: float = STOP_GRACE_S) -> int:
        """SIGTERM, then SIGKILL if it outlives `grace_s`; its exit code."""
        self._terminate()
        try:
            return self.popen.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.popen.wait()

    async def stop_async(self, grace_s: float = STOP_GRACE_S) -> int:
        self._terminate()
        try:
            return await self.wait_exit_async(grace_s)
        except TimeoutError:
            self.kill()
            return await self.wait_exit_async()

    def __enter__(self) -> Process:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> Process:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop_async()


def start(
    name: str,
    argv: list[str],
    tmp: Path,
    *,
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
    ready_file: Path | None = None,
    new_session: bool = False,
) -> Process:
    """Start `argv` (default environment: `base_env()`), its output appended to `<tmp>/<name>.log`.

    A stale `ready_file` is removed first; wait for it with `wait_ready()` or `await wait_ready_async()`.
    `new_session`: its own session and process group (a terminal's Ctrl-C does not reach it)."""
    if ready_file is not None:
        ready_file.unlink(missing_ok=True)
    env = base_env() if env is None else env
    log_path = tmp / f"{name}.log"
    offset = log_path.stat().st_size if log_path.exists() else 0
    popen = start_child(_guarded(argv, env), log_path, env=env, cwd=cwd, new_session=new_session)
    process = Process(name, argv, popen, log_path, offset, ready_file)
    _started.append(process)
    return process


def started_count() -> int:
    """How many processes this test session has started so far (a mark for `started_since`)."""
    return len(_started)


def started_since(mark: int) -> list[Process]:
    """The processes started after `started_count()` returned `mark`."""
    return _started[mark:]


def _guarded(argv: list[str], env: dict[str, str]) -> list[str]:
    """`argv` under the orphan guard, with the test process as the parent: a test session killed
    outright (SIGKILL, a CI timeout) takes what it started along instead of leaving it running. The
    pid stays the child's (the guard runs the module in place, or execs the program)."""
    if argv[:2] == [sys.executable, "-m"] and len(argv) > 2:
        return orphan_guard.command(sys.executable, argv[2], argv[3:])
    program = argv[0] if os.path.isabs(argv[0]) else shutil.which(argv[0], path=env.get("PATH"))
    if program is None:
        raise FileNotFoundError(f"{argv[0]}: not found on PATH")
    return orphan_guard.exec_command(sys.executable, program, argv[1:])


def assert_child_dies_with_parent(name: str, script: str, pid_file: Path, tmp: Path, *, timeout_s: float = 15) -> None:
    """Run `script` (Python source) as a parent process that starts a child and writes the child's
    pid to `pid_file`; SIGKILL the parent and assert the child is gone within `timeout_s`."""
    with start(name, [sys.executable, "-c", script], tmp) as parent:
        wait_until(
            lambda: pid_file.exists() and pid_file.read_text().strip(),
            timeout_s=30,
            message=f"{name} did not start its child",
        )
        child_pid = int(pid_file.read_text())
        assert pid_alive(child_pid)
        parent.kill()
        parent.wait_exit()
        wait_until(lambda: not pid_alive(child_pid), timeout_s=timeout_s, message=f"child outlived its {name}")


@atexit.register
def _kill_leftovers() -> None:
    """A test that forgot to stop what it started does not leave it running after the session."""
    for process in _started:
        if process.running:
            process.kill()
            process.popen.wait()
