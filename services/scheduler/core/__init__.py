"""Pure core of the scheduler: no grpc, no asyncio, no I/O; time is passed in as floats.

Public API (the gRPC shell is written against this):

- `SchedulerCore(params, policy)` with `admit`, `cancel_admission`, `bind_request`, `complete`,
  `renew_leases`, `expire_leases`, `release`, `force_resume`, `tick`, `apply_capacity`, `apply`
  (a control-law `Plan`), and the views `program`, `programs`, `paused_ids`, `waiting_request_ids`,
  `resume_deadline`, `replica_stats`, `stats`; its `ledger` (accounting) and `control` (control law).
- Durable state: `durable.export_*` / `durable.restore` over the records of `state`.
- Inputs: `CapacitySnapshot` / `ReplicaCapacity`, `ReplicaKey`, `TurnOutcome`.
- Outputs: `AdmitResult` (`Decision` + `Effects`), `Effects`, `TickResult`, `ProgramEvent`,
  `LogRecord`, `ProgramView`, `ReplicaStats`, `Stats`; `transition_logs` renders the DEBUG line of each pause
  and resume event.
- `ControlParams` (validated), `to_sglang_priority`, pause policies in `policies`.

Inside, `SchedulerCore` (scheduler.py) composes the accounting (`accounting.Ledger`: program table,
tickets, token sums, release statistics) and the control law (`control.ControlLaw`: bands and the
pause / soft-demote / resume choices, returned as plans the core applies), each readable and tested
alone.
"""

from services.scheduler.core.accounting import normalise_session_id
from services.scheduler.core.errors import DuplicateRequest, MissingRequestId, RequestMismatch, SchedulerError
from services.scheduler.core.model import (
    AdmitResult,
    Band,
    CapacitySnapshot,
    Decision,
    Effects,
    EventKind,
    Lifecycle,
    LogRecord,
    ProgramEvent,
    ProgramView,
    ReplicaCapacity,
    ReplicaKey,
    ReplicaStats,
    Stats,
    Status,
    TickResult,
    TurnOutcome,
    Verdict,
    transition_logs,
)
from services.scheduler.core.params import BUFFER_PER_PROGRAM_TOKENS, ControlParams, to_sglang_priority
from services.scheduler.core.policies import PAUSE_POLICIES, make_pause_policy
from services.scheduler.core.scheduler import SchedulerCore
from services.scheduler.core.scheduler import __file__ as _scheduler_file


def compiled() -> bool:
    """Whether this core runs compiled (the mypyc extension modules scripts/compile_core.py builds) or
    as pure Python: which one, and why, is `services.scheduler.native.describe()`."""
    return not str(_scheduler_file).endswith(".py")


__all__ = [
    "compiled",
    "AdmitResult",
    "Band",
    "BUFFER_PER_PROGRAM_TOKENS",
    "CapacitySnapshot",
    "ControlParams",
    "Decision",
    "DuplicateRequest",
    "Effects",
    "EventKind",
    "Lifecycle",
    "LogRecord",
    "MissingRequestId",
    "PAUSE_POLICIES",
    "ProgramEvent",
    "ProgramView",
    "ReplicaCapacity",
    "ReplicaKey",
    "ReplicaStats",
    "RequestMismatch",
    "SchedulerCore",
    "SchedulerError",
    "Stats",
    "Status",
    "TickResult",
    "TurnOutcome",
    "Verdict",
    "make_pause_policy",
    "normalise_session_id",
    "to_sglang_priority",
    "transition_logs",
]
