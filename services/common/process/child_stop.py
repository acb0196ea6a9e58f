"""Stopping a child process, with every wait bounded: SIGTERM, then SIGKILL past a grace, then give up.

    stop_child(popen, grace_s=10)            # subprocess.Popen
    await stop_child_async(proc, grace_s=10) # asyncio.subprocess.Process

A child stopped by SIGSTOP (a frozen worker, a debugger) does not act on SIGTERM until continued, so
both send SIGCONT after SIGTERM. SIGKILL ends any process that can be ended; one that cannot (stuck in
uninterruptible I/O) is reported and left behind after `KILL_WAIT_S` rather than hanging the caller.
Both return whether the child is gone.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess

log = logging.getLogger(__name__)

KILL_WAIT_S = 5.0


def _signal(send, sig: int) -> None:
    try:
        send(sig)
    except ProcessLookupError:
        pass


def stop_child(
    process: subprocess.Popen | None, grace_s: float = 10.0, *, name: str = "", signalled: bool = False
) -> bool:
    """`signalled`: the caller already sent SIGTERM (and SIGCONT), e.g. to several children at once; only
    wait, then kill. Never send SIGTERM twice: a service shutting down has given its handler back, and a
    second SIGTERM would end it at once, cutting its graceful stop (flushes, final writes) short."""
    if process is None or process.poll() is not None:
        return True
    if not signalled:
        _signal(process.send_signal, signal.SIGTERM)
        _signal(process.send_signal, signal.SIGCONT)
    try:
        process.wait(timeout=grace_s)
        return True
    except subprocess.TimeoutExpired:
        log.warning("%s (pid %d) did not stop within %gs; killing it", name or "child", process.pid, grace_s)
    _signal(process.send_signal, signal.SIGKILL)
    try:
        process.wait(timeout=KILL_WAIT_S)
        return True
    except subprocess.TimeoutExpired:
        log.error("%s (pid %d) survived SIGKILL for %gs; leaving it", name or "child", process.pid, KILL_WAIT_S)
        return False


async def stop_child_async(
    process: asyncio.subprocess.Process | None, grace_s: float = 10.0, *, name: str = ""
) -> bool:
    if process is None or process.returncode is not None:
        return True
    _signal(process.send_signal, signal.SIGTERM)
    _signal(process.send_signal, signal.SIGCONT)
    try:
        await asyncio.wait_for(process.wait(), grace_s)
        return True
    except TimeoutError:
        log.warning("%s (pid %d) did not stop within %gs; killing it", name or "child", process.pid, grace_s)
    _signal(process.send_signal, signal.SIGKILL)
    try:
        await asyncio.wait_for(process.wait(), KILL_WAIT_S)
        return True
    except TimeoutError:
        log.error("%s (pid %d) survived SIGKILL for %gs; leaving it", name or "child", process.pid, KILL_WAIT_S)
        return False
