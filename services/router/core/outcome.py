"""How a turn ended, as the router tells the scheduler (Complete) and its traces (`router.outcome`).

Pure: the scheduler client (adapters/scheduler.py) maps it to the protobuf `TurnOutcome`.
"""

from __future__ import annotations

import enum


class Outcome(enum.Enum):
    """The value is the `router.outcome` span attribute."""

    OK = "ok"  # the worker's answer reached the client
    CANCELLED = "cancelled"  # the client went away
    FAILED = "failed"  # the worker failed (before or after the first token)
    # Admitted, but nothing was sent to a worker (its client left first, or no worker could take it):
    # the scheduler rolls the admission back exactly, so a turn that never ran is never counted.
    NOT_STARTED = "not_started"
