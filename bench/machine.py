"""The `machine` block of every benchmark's JSON report: what ran it, so that figures from different
machines (or a loaded one) are never compared as if alike.

    report["machine"] = machine(note="...")      # python, cpus, platform, the 1/5/15-minute load, extras
"""

from __future__ import annotations

import os
import platform
from typing import Any


def loadavg() -> list[float] | None:
    """The 1, 5 and 15-minute load averages, or None where the platform has none."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return None


def machine(**extra: Any) -> dict[str, Any]:
    """The report's `machine` block: the interpreter, the CPUs, the platform and the load now, then `extra`
    (a benchmark's own facts: load at its start, its workers' lateness, a note)."""
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "loadavg": loadavg(),
        **extra,
    }
