"""Batch job ids and statuses as the planner knows them (demand only: counts and deadlines)."""

from __future__ import annotations

import re

TERMINAL_STATUSES = frozenset({"failed", "completed", "expired", "cancelled"})
"""OpenAI Batch statuses after which a job asks for nothing more."""
FINAL_STATUSES = TERMINAL_STATUSES
"""What a dispatcher may report as a job's end (`ReportDispatch.final_status`)."""
MAX_ID_CHARS = 64
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")


def check_id(value: str, field: str) -> str:
    """An id (job, pool) as a client may name it: 1-64 characters of [A-Za-z0-9._:-], starting with a letter
    or digit. Ids are keys and appear in logs, lease records and error messages: anything else is refused
    before it is stored or echoed. The batch service applies the same rule to its file and batch ids."""
    if not _ID.match(value):
        shown = value[:16].encode("unicode_escape").decode("ascii")
        raise ValueError(
            f"{field} must be 1-{MAX_ID_CHARS} characters of letters, digits and '._:-' "
            f"(got {shown!r}{'...' if len(value) > 16 else ''})"
        )
    return value
