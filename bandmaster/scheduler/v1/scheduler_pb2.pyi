import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProgramStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROGRAM_STATUS_UNSPECIFIED: _ClassVar[ProgramStatus]
    PROGRAM_STATUS_REASONING: _ClassVar[ProgramStatus]
    PROGRAM_STATUS_ACTING: _ClassVar[ProgramStatus]

class Lifecycle(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LIFECYCLE_UNSPECIFIED: _ClassVar[Lifecycle]
    LIFECYCLE_ACTIVE: _ClassVar[Lifecycle]
    LIFECYCLE_PAUSED: _ClassVar[Lifecycle]

class TurnOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TURN_OUTCOME_UNSPECIFIED: _ClassVar[TurnOutcome]
    TURN_OUTCOME_OK: _ClassVar[TurnOutcome]
    TURN_OUTCOME_CANCELLED: _ClassVar[TurnOutcome]
    TURN_OUTCOME_FAILED: _ClassVar[TurnOutcome]
    TURN_OUTCOME_NOT_STARTED: _ClassVar[TurnOutcome]

class Band(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BAND_UNSPECIFIED: _ClassVar[Band]
    BAND_NORMAL: _ClassVar[Band]
    BAND_SOFT_DEMOTE: _ClassVar[Band]
    BAND_PAUSE: _ClassVar[Band]

class EventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_KIND_UNSPECIFIED: _ClassVar[EventKind]
    EVENT_KIND_ADMITTED: _ClassVar[EventKind]
    EVENT_KIND_PAUSED: _ClassVar[EventKind]
    EVENT_KIND_MARKED: _ClassVar[EventKind]
    EVENT_KIND_SOFT_DEMOTED: _ClassVar[EventKind]
    EVENT_KIND_RESUMED: _ClassVar[EventKind]
    EVENT_KIND_FORCED_RESUME: _ClassVar[EventKind]
    EVENT_KIND_RELEASED: _ClassVar[EventKind]
    EVENT_KIND_EXPIRED: _ClassVar[EventKind]
PROGRAM_STATUS_UNSPECIFIED: ProgramStatus
PROGRAM_STATUS_REASONING: ProgramStatus
PROGRAM_STATUS_ACTING: ProgramStatus
LIFECYCLE_UNSPECIFIED: Lifecycle
LIFECYCLE_ACTIVE: Lifecycle
LIFECYCLE_PAUSED: Lifecycle
TURN_OUTCOME_UNSPECIFIED: TurnOutcome
TURN_OUTCOME_OK: TurnOutcome
TURN_OUTCOME_CANCELLED: TurnOutcome
TURN_OUTCOME_FAILED: TurnOutcome
TURN_OUTCOME_NOT_STARTED: TurnOutcome
BAND_UNSPECIFIED: Band
BAND_NORMAL: Band
BAND_SOFT_DEMOTE: Band
BAND_PAUSE: Band
EVENT_KIND_UNSPECIFIED: EventKind
EVENT_KIND_ADMITTED: EventKind
EVENT_KIND_PAUSED: EventKind
EVENT_KIND_MARKED: EventKind
EVENT_KIND_SOFT_DEMOTED: EventKind
EVENT_KIND_RESUMED: EventKind
EVENT_KIND_FORCED_RESUME: EventKind
EVENT_KIND_RELEASED: EventKind
EVENT_KIND_EXPIRED: EventKind

class AdmitRequest(_message.Message):
    __slots__ = ("session_id", "parent_session_id", "estimated_prompt_tokens", "request_id", "dispatched", "dispatched_worker_id", "dispatched_dp_rank")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DISPATCHED_FIELD_NUMBER: _ClassVar[int]
    DISPATCHED_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    DISPATCHED_DP_RANK_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    parent_session_id: str
    estimated_prompt_tokens: int
    request_id: str
    dispatched: bool
    dispatched_worker_id: str
    dispatched_dp_rank: int
    def __init__(self, session_id: _Optional[str] = ..., parent_session_id: _Optional[str] = ..., estimated_prompt_tokens: _Optional[int] = ..., request_id: _Optional[str] = ..., dispatched: _Optional[bool] = ..., dispatched_worker_id: _Optional[str] = ..., dispatched_dp_rank: _Optional[int] = ...) -> None: ...

class AdmitResponse(_message.Message):
    __slots__ = ("worker_id", "dp_rank", "pinned", "priority", "held_seconds", "forced_resume", "admission_epoch", "was_paused", "was_soft_demoted", "priority_seconds", "lease_ttl_seconds")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    HELD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FORCED_RESUME_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    WAS_PAUSED_FIELD_NUMBER: _ClassVar[int]
    WAS_SOFT_DEMOTED_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    dp_rank: int
    pinned: bool
    priority: int
    held_seconds: float
    forced_resume: bool
    admission_epoch: int
    was_paused: bool
    was_soft_demoted: bool
    priority_seconds: float
    lease_ttl_seconds: float
    def __init__(self, worker_id: _Optional[str] = ..., dp_rank: _Optional[int] = ..., pinned: _Optional[bool] = ..., priority: _Optional[int] = ..., held_seconds: _Optional[float] = ..., forced_resume: _Optional[bool] = ..., admission_epoch: _Optional[int] = ..., was_paused: _Optional[bool] = ..., was_soft_demoted: _Optional[bool] = ..., priority_seconds: _Optional[float] = ..., lease_ttl_seconds: _Optional[float] = ...) -> None: ...

class AdmitHeld(_message.Message):
    __slots__ = ("max_hold_seconds", "heartbeat_seconds")
    MAX_HOLD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    max_hold_seconds: float
    heartbeat_seconds: float
    def __init__(self, max_hold_seconds: _Optional[float] = ..., heartbeat_seconds: _Optional[float] = ...) -> None: ...

class AdmitUpdate(_message.Message):
    __slots__ = ("held", "decision")
    HELD_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    held: AdmitHeld
    decision: AdmitResponse
    def __init__(self, held: _Optional[_Union[AdmitHeld, _Mapping]] = ..., decision: _Optional[_Union[AdmitResponse, _Mapping]] = ...) -> None: ...

class BindRequest(_message.Message):
    __slots__ = ("request_id", "worker_id", "dp_rank")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    worker_id: str
    dp_rank: int
    def __init__(self, request_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., dp_rank: _Optional[int] = ...) -> None: ...

class BindResponse(_message.Message):
    __slots__ = ("bound",)
    BOUND_FIELD_NUMBER: _ClassVar[int]
    bound: bool
    def __init__(self, bound: _Optional[bool] = ...) -> None: ...

class CompleteRequest(_message.Message):
    __slots__ = ("session_id", "request_id", "worker_id", "dp_rank", "prompt_tokens", "completion_tokens", "cached_tokens", "outcome", "ttft_seconds")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    TTFT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    request_id: str
    worker_id: str
    dp_rank: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    outcome: TurnOutcome
    ttft_seconds: float
    def __init__(self, session_id: _Optional[str] = ..., request_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., dp_rank: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., outcome: _Optional[_Union[TurnOutcome, str]] = ..., ttft_seconds: _Optional[float] = ...) -> None: ...

class CompleteResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RenewLeasesRequest(_message.Message):
    __slots__ = ("request_ids", "delivered_request_ids")
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    delivered_request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_ids: _Optional[_Iterable[str]] = ..., delivered_request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class RenewLeasesResponse(_message.Message):
    __slots__ = ("renewed", "unknown_request_ids", "lease_ttl_seconds")
    RENEWED_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    renewed: int
    unknown_request_ids: _containers.RepeatedScalarFieldContainer[str]
    lease_ttl_seconds: float
    def __init__(self, renewed: _Optional[int] = ..., unknown_request_ids: _Optional[_Iterable[str]] = ..., lease_ttl_seconds: _Optional[float] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...

class Program(_message.Message):
    __slots__ = ("session_id", "parent_session_id", "status", "lifecycle", "token_total", "tokens_estimated", "worker_id", "dp_rank", "marked", "soft_demoted", "turns", "created_at", "last_activity", "paused_since", "children")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LIFECYCLE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_TOTAL_FIELD_NUMBER: _ClassVar[int]
    TOKENS_ESTIMATED_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    MARKED_FIELD_NUMBER: _ClassVar[int]
    SOFT_DEMOTED_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_ACTIVITY_FIELD_NUMBER: _ClassVar[int]
    PAUSED_SINCE_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    parent_session_id: str
    status: ProgramStatus
    lifecycle: Lifecycle
    token_total: int
    tokens_estimated: bool
    worker_id: str
    dp_rank: int
    marked: bool
    soft_demoted: bool
    turns: int
    created_at: _timestamp_pb2.Timestamp
    last_activity: _timestamp_pb2.Timestamp
    paused_since: _timestamp_pb2.Timestamp
    children: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session_id: _Optional[str] = ..., parent_session_id: _Optional[str] = ..., status: _Optional[_Union[ProgramStatus, str]] = ..., lifecycle: _Optional[_Union[Lifecycle, str]] = ..., token_total: _Optional[int] = ..., tokens_estimated: _Optional[bool] = ..., worker_id: _Optional[str] = ..., dp_rank: _Optional[int] = ..., marked: _Optional[bool] = ..., soft_demoted: _Optional[bool] = ..., turns: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_activity: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., paused_since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., children: _Optional[_Iterable[str]] = ...) -> None: ...

class GetProgramRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class ReplicaUtilization(_message.Message):
    __slots__ = ("worker_id", "dp_rank", "retention_tokens", "used_tokens", "used_decayed_tokens", "utilization", "band", "active_programs", "passthrough_requests", "resident_programs", "max_programs")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    RETENTION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    USED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    USED_DECAYED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    BAND_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_PROGRAMS_FIELD_NUMBER: _ClassVar[int]
    PASSTHROUGH_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_PROGRAMS_FIELD_NUMBER: _ClassVar[int]
    MAX_PROGRAMS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    dp_rank: int
    retention_tokens: int
    used_tokens: int
    used_decayed_tokens: int
    utilization: float
    band: Band
    active_programs: int
    passthrough_requests: int
    resident_programs: int
    max_programs: int
    def __init__(self, worker_id: _Optional[str] = ..., dp_rank: _Optional[int] = ..., retention_tokens: _Optional[int] = ..., used_tokens: _Optional[int] = ..., used_decayed_tokens: _Optional[int] = ..., utilization: _Optional[float] = ..., band: _Optional[_Union[Band, str]] = ..., active_programs: _Optional[int] = ..., passthrough_requests: _Optional[int] = ..., resident_programs: _Optional[int] = ..., max_programs: _Optional[int] = ...) -> None: ...

class ListProgramsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListProgramsResponse(_message.Message):
    __slots__ = ("programs", "replicas")
    PROGRAMS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    programs: _containers.RepeatedCompositeFieldContainer[Program]
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaUtilization]
    def __init__(self, programs: _Optional[_Iterable[_Union[Program, _Mapping]]] = ..., replicas: _Optional[_Iterable[_Union[ReplicaUtilization, _Mapping]]] = ...) -> None: ...

class ProgramEvent(_message.Message):
    __slots__ = ("kind", "session_id", "worker_id", "dp_rank", "tokens", "at", "reason")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    kind: EventKind
    session_id: str
    worker_id: str
    dp_rank: int
    tokens: int
    at: _timestamp_pb2.Timestamp
    reason: str
    def __init__(self, kind: _Optional[_Union[EventKind, str]] = ..., session_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., dp_rank: _Optional[int] = ..., tokens: _Optional[int] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ("end_on_gap", "exclude_kinds")
    END_ON_GAP_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_KINDS_FIELD_NUMBER: _ClassVar[int]
    end_on_gap: bool
    exclude_kinds: _containers.RepeatedScalarFieldContainer[EventKind]
    def __init__(self, end_on_gap: _Optional[bool] = ..., exclude_kinds: _Optional[_Iterable[_Union[EventKind, str]]] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Stats(_message.Message):
    __slots__ = ("programs_active", "programs_paused", "programs_reasoning", "programs_acting", "pauses_total", "resumes_total", "forced_resumes_total", "waiting_admissions", "replicas", "capacity_version", "marks_total", "expired_total", "released_total", "admissions_total", "admissions_cancelled_total", "passthrough_in_flight", "completes_ignored_total", "tickets_expired_total", "tickets_in_flight", "state_recovery_seconds", "state_recovered_programs")
    PROGRAMS_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    PROGRAMS_PAUSED_FIELD_NUMBER: _ClassVar[int]
    PROGRAMS_REASONING_FIELD_NUMBER: _ClassVar[int]
    PROGRAMS_ACTING_FIELD_NUMBER: _ClassVar[int]
    PAUSES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    RESUMES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    FORCED_RESUMES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    WAITING_ADMISSIONS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_VERSION_FIELD_NUMBER: _ClassVar[int]
    MARKS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    RELEASED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    ADMISSIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    ADMISSIONS_CANCELLED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PASSTHROUGH_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    COMPLETES_IGNORED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    TICKETS_EXPIRED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    TICKETS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    STATE_RECOVERY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STATE_RECOVERED_PROGRAMS_FIELD_NUMBER: _ClassVar[int]
    programs_active: int
    programs_paused: int
    programs_reasoning: int
    programs_acting: int
    pauses_total: int
    resumes_total: int
    forced_resumes_total: int
    waiting_admissions: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaUtilization]
    capacity_version: int
    marks_total: int
    expired_total: int
    released_total: int
    admissions_total: int
    admissions_cancelled_total: int
    passthrough_in_flight: int
    completes_ignored_total: int
    tickets_expired_total: int
    tickets_in_flight: int
    state_recovery_seconds: float
    state_recovered_programs: int
    def __init__(self, programs_active: _Optional[int] = ..., programs_paused: _Optional[int] = ..., programs_reasoning: _Optional[int] = ..., programs_acting: _Optional[int] = ..., pauses_total: _Optional[int] = ..., resumes_total: _Optional[int] = ..., forced_resumes_total: _Optional[int] = ..., waiting_admissions: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaUtilization, _Mapping]]] = ..., capacity_version: _Optional[int] = ..., marks_total: _Optional[int] = ..., expired_total: _Optional[int] = ..., released_total: _Optional[int] = ..., admissions_total: _Optional[int] = ..., admissions_cancelled_total: _Optional[int] = ..., passthrough_in_flight: _Optional[int] = ..., completes_ignored_total: _Optional[int] = ..., tickets_expired_total: _Optional[int] = ..., tickets_in_flight: _Optional[int] = ..., state_recovery_seconds: _Optional[float] = ..., state_recovered_programs: _Optional[int] = ...) -> None: ...

class GetRouterConfigRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RouterConfig(_message.Message):
    __slots__ = ("router_temperature", "kv_overlap_score_weight", "use_kv_events", "router_track_active_blocks", "router_track_output_blocks", "router_track_prefill_tokens", "router_ttl_secs", "router_block_size")
    ROUTER_TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    KV_OVERLAP_SCORE_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    USE_KV_EVENTS_FIELD_NUMBER: _ClassVar[int]
    ROUTER_TRACK_ACTIVE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    ROUTER_TRACK_OUTPUT_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    ROUTER_TRACK_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ROUTER_TTL_SECS_FIELD_NUMBER: _ClassVar[int]
    ROUTER_BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    router_temperature: float
    kv_overlap_score_weight: float
    use_kv_events: bool
    router_track_active_blocks: bool
    router_track_output_blocks: bool
    router_track_prefill_tokens: bool
    router_ttl_secs: float
    router_block_size: int
    def __init__(self, router_temperature: _Optional[float] = ..., kv_overlap_score_weight: _Optional[float] = ..., use_kv_events: _Optional[bool] = ..., router_track_active_blocks: _Optional[bool] = ..., router_track_output_blocks: _Optional[bool] = ..., router_track_prefill_tokens: _Optional[bool] = ..., router_ttl_secs: _Optional[float] = ..., router_block_size: _Optional[int] = ...) -> None: ...

class MuxAdmit(_message.Message):
    __slots__ = ("request", "timeout_seconds", "traceparent", "tracestate")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    TRACESTATE_FIELD_NUMBER: _ClassVar[int]
    request: AdmitRequest
    timeout_seconds: float
    traceparent: str
    tracestate: str
    def __init__(self, request: _Optional[_Union[AdmitRequest, _Mapping]] = ..., timeout_seconds: _Optional[float] = ..., traceparent: _Optional[str] = ..., tracestate: _Optional[str] = ...) -> None: ...

class MuxComplete(_message.Message):
    __slots__ = ("request", "traceparent", "tracestate")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    TRACESTATE_FIELD_NUMBER: _ClassVar[int]
    request: CompleteRequest
    traceparent: str
    tracestate: str
    def __init__(self, request: _Optional[_Union[CompleteRequest, _Mapping]] = ..., traceparent: _Optional[str] = ..., tracestate: _Optional[str] = ...) -> None: ...

class MuxCancel(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MuxBind(_message.Message):
    __slots__ = ("request", "traceparent", "tracestate")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    TRACESTATE_FIELD_NUMBER: _ClassVar[int]
    request: BindRequest
    traceparent: str
    tracestate: str
    def __init__(self, request: _Optional[_Union[BindRequest, _Mapping]] = ..., traceparent: _Optional[str] = ..., tracestate: _Optional[str] = ...) -> None: ...

class MuxOp(_message.Message):
    __slots__ = ("id", "admit", "cancel", "complete", "bind")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADMIT_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    BIND_FIELD_NUMBER: _ClassVar[int]
    id: int
    admit: MuxAdmit
    cancel: MuxCancel
    complete: MuxComplete
    bind: MuxBind
    def __init__(self, id: _Optional[int] = ..., admit: _Optional[_Union[MuxAdmit, _Mapping]] = ..., cancel: _Optional[_Union[MuxCancel, _Mapping]] = ..., complete: _Optional[_Union[MuxComplete, _Mapping]] = ..., bind: _Optional[_Union[MuxBind, _Mapping]] = ...) -> None: ...

class MuxRequest(_message.Message):
    __slots__ = ("ops",)
    OPS_FIELD_NUMBER: _ClassVar[int]
    ops: _containers.RepeatedCompositeFieldContainer[MuxOp]
    def __init__(self, ops: _Optional[_Iterable[_Union[MuxOp, _Mapping]]] = ...) -> None: ...

class MuxError(_message.Message):
    __slots__ = ("code", "message", "leader_address")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    leader_address: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., leader_address: _Optional[str] = ...) -> None: ...

class MuxResult(_message.Message):
    __slots__ = ("id", "admit", "complete", "error", "bind")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADMIT_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    BIND_FIELD_NUMBER: _ClassVar[int]
    id: int
    admit: AdmitUpdate
    complete: CompleteResponse
    error: MuxError
    bind: BindResponse
    def __init__(self, id: _Optional[int] = ..., admit: _Optional[_Union[AdmitUpdate, _Mapping]] = ..., complete: _Optional[_Union[CompleteResponse, _Mapping]] = ..., error: _Optional[_Union[MuxError, _Mapping]] = ..., bind: _Optional[_Union[BindResponse, _Mapping]] = ...) -> None: ...

class MuxResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[MuxResult]
    def __init__(self, results: _Optional[_Iterable[_Union[MuxResult, _Mapping]]] = ...) -> None: ...

class GetLeadershipRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Leadership(_message.Message):
    __slots__ = ("role", "replica_id", "address", "leader_address", "epoch", "leader_for_seconds", "terms_total")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEADER_FOR_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TERMS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    role: str
    replica_id: str
    address: str
    leader_address: str
    epoch: int
    leader_for_seconds: float
    terms_total: int
    def __init__(self, role: _Optional[str] = ..., replica_id: _Optional[str] = ..., address: _Optional[str] = ..., leader_address: _Optional[str] = ..., epoch: _Optional[int] = ..., leader_for_seconds: _Optional[float] = ..., terms_total: _Optional[int] = ...) -> None: ...
