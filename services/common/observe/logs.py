"""Logging set-up shared by every process: one line per record, logger name first, no per-token logging."""

from __future__ import annotations

import logging
import os
import sys

_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")


def setup_logging(level: str = "INFO", *, stream=None) -> None:
    """Configure the root logger once per process. `BANDMASTER_LOG_LEVEL` overrides `level`."""
    level = os.environ.get("BANDMASTER_LOG_LEVEL", level).upper()
    if level not in LEVELS:
        level = "INFO"
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(logging.Formatter(_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # Third-party chatter stays at WARNING unless we debug ourselves.
    for noisy in ("grpc", "aiohttp.access", "urllib3", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
