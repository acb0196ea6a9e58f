"""The ready file: a service publishes where it listens, once serving, for a supervising process
(`bandmaster up`, the planner's local connector, benches, tests) that polls for it.

The file appears whole or not at all: the JSON is written to a temporary file in the same directory,
then renamed over `path`. A reader never sees a partial document.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Mapping


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
