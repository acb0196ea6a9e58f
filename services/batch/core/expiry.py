"""When stored files expire, pure.

OpenAI: a file uploaded with `purpose=batch` expires 30 days after it was created unless the upload says
otherwise with `expires_after: {"anchor": "created_at", "seconds": N}`, N between one hour and 30 days; a
batch's output and error files likewise (`output_expires_after` on batch creation). Here the default is
the batch service's `--file-retention-seconds` (30 days unless set). An expired file is deleted by the
cleanup loop (services/batch/cleanup.py), except an input file a batch still running uses: it goes once
that batch has ended.
"""

from __future__ import annotations

from typing import Mapping

from services.batch.core.batch_api import BatchInputError

MIN_EXPIRES_AFTER_S = 3600
MAX_EXPIRES_AFTER_S = 30 * 24 * 3600
DEFAULT_RETENTION_S = MAX_EXPIRES_AFTER_S


def parse_expires_after(value: object, param: str = "expires_after") -> int | None:
    """`{"anchor": "created_at", "seconds": N}` -> N (None when absent). Anything else is a 400 naming `param`."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise BatchInputError(f"{param} must be an object {{anchor, seconds}}", param=param)
    anchor = value.get("anchor")
    if anchor != "created_at":
        raise BatchInputError(f"{param}.anchor must be 'created_at'", param=f"{param}.anchor")
    seconds = value.get("seconds")
    if isinstance(seconds, str) and seconds.strip().isdigit():
        seconds = int(seconds)  # a multipart form field is text
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        raise BatchInputError(f"{param}.seconds must be an integer", param=f"{param}.seconds")
    if not MIN_EXPIRES_AFTER_S <= seconds <= MAX_EXPIRES_AFTER_S:
        raise BatchInputError(
            f"{param}.seconds must be between {MIN_EXPIRES_AFTER_S} (1 hour) and {MAX_EXPIRES_AFTER_S} (30 days)",
            param=f"{param}.seconds",
        )
    return seconds


def expires_at(created_at: int, seconds: int | None, default_s: int) -> int:
    """The Unix second a file created at `created_at` expires: its own `seconds`, else the service default."""
    return created_at + (default_s if seconds is None else seconds)


def is_expired(expires_at_s: int | None, now: int) -> bool:
    return expires_at_s is not None and now >= expires_at_s
