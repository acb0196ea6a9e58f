"""Run a page's doc-run blocks (scripts/doc_markers.py) as a reader would, verbatim, in a scratch directory.

    run_page(Path("docs/getting-started.md"), tmp_path)   # AssertionError naming the block and command

The scratch directory holds a `.venv` link to the venv running the tests, so `.venv/bin/bandmaster` in a page
is that venv's console script, and the venv's bin is first on PATH (a bare `bandmaster` or `python` too). The
repository is on PYTHONPATH (its code, not an installed copy) and `bandmaster up` writes its discovery file
and its state directory into the scratch directory (BANDMASTER_CLUSTERS_DIR, TMPDIR), so the commands change
nothing outside it. Each bash command runs on its own (`bash -o pipefail -c COMMAND`) and must exit 0 and
match its `# expect:` pattern; a python block runs as a script. Background blocks (`bandmaster up`) run in
their own process group until a later block stops them or the page ends: SIGINT, as Ctrl-C in the terminal,
then SIGKILL if they outlive STOP_GRACE_S; a background block that does not stop on SIGINT fails the run.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from scripts.doc_markers import DocBlock, doc_blocks
from tests.support.processes import Process, base_env, start

STOP_GRACE_S = 20.0
INTERRUPTED = (0, 128 + signal.SIGINT, -signal.SIGINT)
"""A live view or a cluster that ends on Ctrl-C exits 0, or 130 as a shell reports it."""


def venv_dir() -> Path:
    """The venv running the tests (its bin holds the `bandmaster` console script)."""
    return Path(sys.prefix)


def page_env(workdir: Path) -> dict[str, str]:
    bin_dir = venv_dir() / "bin"
    return base_env(
        PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        VIRTUAL_ENV=str(venv_dir()),
        BANDMASTER_CLUSTERS_DIR=str(workdir / "clusters"),
        TMPDIR=str(workdir),  # `up`'s default state directory, and any other temporary file, land here
        PYTHONUNBUFFERED="1",
    )


class PageRun:
    """The run of one page's blocks, in order, sharing one scratch directory and environment."""

    def __init__(self, page: Path, workdir: Path) -> None:
        self.page = page
        self.workdir = workdir
        self.env = page_env(workdir)
        self.background: dict[str, Process] = {}
        self.ran: list[str] = []
        self._count = 0
        link = workdir / ".venv"
        if not link.exists():
            link.symlink_to(venv_dir(), target_is_directory=True)

    def where(self, block: DocBlock) -> str:
        return f"{self.page.name} line {block.line} (doc-run {block.name})"

    def _start(self, block: DocBlock, argv: list[str]) -> Process:
        self._count += 1
        name = f"{self._count:02d}-{re.sub(r'[^A-Za-z0-9_.-]', '_', block.name)}"
        return start(name, argv, self.workdir, env=self.env, cwd=self.workdir, new_session=True)

    def _finish(self, block: DocBlock, what: str, process: Process, timeout_s: float, expect: str | None) -> None:
        status = _exit_or_kill(process, timeout_s)
        assert status is not None, (
            f"{self.where(block)}: `{what}` still running after {timeout_s:g} s\n{process.log_tail()}"
        )
        output = process.log_text()
        assert status == 0, f"{self.where(block)}: `{what}` exited {status}\n{_tail(output)}"
        if expect is not None:
            assert re.search(expect, output, re.M), (
                f"{self.where(block)}: the output of `{what}` does not match {expect!r}\n{_tail(output)}"
            )
        self.ran.append(what)

    def run_block(self, block: DocBlock) -> None:
        options = block.options or {}
        for name in filter(None, options.get("stop", "").split(",")):
            assert name in self.background, f"{self.where(block)}: stop={name}: no such background block running"
            self.stop(name)
        if block.lang == "python":
            script = self.workdir / f"{block.name}.py"
            script.write_text(block.text + "\n")
            process = self._start(block, [str(venv_dir() / "bin" / "python"), str(script)])
            self._finish(block, f"python {script.name}", process, block.timeout_s, options.get("expect"))
            return
        commands = block.commands()
        if "background" in options or "interactive" in options:
            assert len(commands) == 1, f"{self.where(block)}: a background block holds one command"
            command, _ = commands[0]
            process = self._start(block, ["bash", "-o", "pipefail", "-c", command])
            ready = options["ready"]
            process.wait_for(
                lambda: re.search(ready, process.log_text(), re.M),
                timeout_s=block.timeout_s,
                what=f"{self.where(block)}: `{command}` printing {ready!r}",
            )
            self.ran.append(command)
            if "interactive" in options:
                self._interrupt(block.name, process)
            else:
                self.background[block.name] = process
            return
        for command, expect in commands:
            process = self._start(block, ["bash", "-o", "pipefail", "-c", command])
            self._finish(block, command, process, block.timeout_s, expect or options.get("expect"))

    def _interrupt(self, name: str, process: Process) -> None:
        """Ctrl-C: SIGINT to its process group; it must end within STOP_GRACE_S, as 0 or 130."""
        _signal_group(process, signal.SIGINT)
        status = _exit_or_kill(process, STOP_GRACE_S)
        assert status is not None, (
            f"{self.page.name}: {name} did not stop within {STOP_GRACE_S:g} s of Ctrl-C\n{process.log_tail()}"
        )
        assert status in INTERRUPTED, f"{self.page.name}: {name} exited {status} on Ctrl-C\n{process.log_tail()}"

    def stop(self, name: str) -> None:
        self._interrupt(name, self.background.pop(name))

    def close(self) -> None:
        """Stop what still runs in the background, last started first (also after a failure)."""
        errors = []
        for name in reversed(list(self.background)):
            try:
                self.stop(name)
            except AssertionError as error:
                errors.append(str(error))
        assert not errors, "\n".join(errors)


def _exit_or_kill(process: Process, timeout_s: float) -> int | None:
    """Its exit status within `timeout_s`; else its process group is killed (bounded) and None returned."""
    try:
        return process.wait_exit(timeout_s)
    except subprocess.TimeoutExpired:
        _signal_group(process, signal.SIGKILL)
        process.wait_exit(10)
        return None


def _signal_group(process: Process, sig: int) -> None:
    if process.running:
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass


def _tail(output: str, lines: int = 40) -> str:
    return "\n".join(output.splitlines()[-lines:])


def run_page(page: Path, workdir: Path) -> list[str]:
    """Run every doc-run block of `page` in order; the commands that ran. Skipped and unmarked blocks
    are not run (the test that every bash block is marked is separate)."""
    run = PageRun(page, workdir)
    try:
        for block in doc_blocks(page.read_text()):
            if block.options is not None and not block.skipped:
                run.run_block(block)
    finally:
        run.close()
    return run.ran
