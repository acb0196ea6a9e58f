"""The ready file: a service publishes where it listens, once serving, for a supervising process
(`bandmaster up`, the planner's local connector, benches, tests) that polls for it. Both ends live
here: `write_ready_file` (the service) and `read_ready_file` / `wait_ready_file` (and its async twin,
`wait_ready_file_async`) for every reader.

The file appears whole or not at all: the JSON is written to a temporary file in the same directory,
then renamed over `path`. A reader never sees a partial document.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping


def write_ready_file(path: str, payload: Mapping[str, Any]) -> None:
    """Write `payload` as JSON to `path` atomically; an empty `path` (no `--ready-file`) writes nothing."""
    if not path:
        return
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".ready-", dir=directory)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(dict(payload), fh)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def read_ready_file(path: str | Path) -> dict[str, Any] | None:
    """What the service published at `path`; None while there is nothing there (not yet written, or
    unreadable, or not a JSON object)."""
    try:
        payload = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return payload if isinstance(payload, dict) else None


def wait_ready_file(
    path: str | Path,
    timeout_s: float,
    *,
    alive: Callable[[], bool] = lambda: True,
    interval_s: float = 0.05,
) -> dict[str, Any] | None:
    """Poll `path` until the service publishes it; None once `alive()` is false (the process exited) or
    `timeout_s` has passed (every wait is bounded). The caller names the failure."""
    deadline = time.monotonic() + timeout_s
    while True:
        payload = read_ready_file(path)
        if payload is not None:
            return payload
        if not alive() or time.monotonic() > deadline:
            return None
        time.sleep(interval_s)


async def wait_ready_file_async(
    path: str | Path,
    timeout_s: float,
    *,
    alive: Callable[[], bool] = lambda: True,
    interval_s: float = 0.05,
) -> dict[str, Any] | None:
    """`wait_ready_file` for a caller on an event loop: the same bound, the loop's sleep."""
    deadline = time.monotonic() + timeout_s
    while (payload := read_ready_file(path)) is None:
        if not alive() or time.monotonic() > deadline:
            return None
        await asyncio.sleep(interval_s)
    return payload
