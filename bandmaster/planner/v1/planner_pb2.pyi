import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BatchJobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BATCH_JOB_STATE_UNSPECIFIED: _ClassVar[BatchJobState]
    BATCH_JOB_STATE_QUEUED: _ClassVar[BatchJobState]
    BATCH_JOB_STATE_RUNNING: _ClassVar[BatchJobState]
    BATCH_JOB_STATE_DONE: _ClassVar[BatchJobState]
    BATCH_JOB_STATE_FAILED: _ClassVar[BatchJobState]
    BATCH_JOB_STATE_CANCELLED: _ClassVar[BatchJobState]
    BATCH_JOB_STATE_EXPIRED: _ClassVar[BatchJobState]

class Provenance(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROVENANCE_UNSPECIFIED: _ClassVar[Provenance]
    PROVENANCE_PROPOSE: _ClassVar[Provenance]
    PROVENANCE_RECONCILE: _ClassVar[Provenance]
    PROVENANCE_CONSTRAIN: _ClassVar[Provenance]
    PROVENANCE_FAIL_CLOSED: _ClassVar[Provenance]
BATCH_JOB_STATE_UNSPECIFIED: BatchJobState
BATCH_JOB_STATE_QUEUED: BatchJobState
BATCH_JOB_STATE_RUNNING: BatchJobState
BATCH_JOB_STATE_DONE: BatchJobState
BATCH_JOB_STATE_FAILED: BatchJobState
BATCH_JOB_STATE_CANCELLED: BatchJobState
BATCH_JOB_STATE_EXPIRED: BatchJobState
PROVENANCE_UNSPECIFIED: Provenance
PROVENANCE_PROPOSE: Provenance
PROVENANCE_RECONCILE: Provenance
PROVENANCE_CONSTRAIN: Provenance
PROVENANCE_FAIL_CLOSED: Provenance

class BatchJob(_message.Message):
    __slots__ = ("job_id", "pool_id", "total_requests", "dispatched_requests", "completed_requests", "deadline", "state", "submitted_at", "status", "failed_requests", "endpoint", "external")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    TOTAL_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    DISPATCHED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FAILED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    pool_id: str
    total_requests: int
    dispatched_requests: int
    completed_requests: int
    deadline: _timestamp_pb2.Timestamp
    state: BatchJobState
    submitted_at: _timestamp_pb2.Timestamp
    status: str
    failed_requests: int
    endpoint: str
    external: bool
    def __init__(self, job_id: _Optional[str] = ..., pool_id: _Optional[str] = ..., total_requests: _Optional[int] = ..., dispatched_requests: _Optional[int] = ..., completed_requests: _Optional[int] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., state: _Optional[_Union[BatchJobState, str]] = ..., submitted_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., status: _Optional[str] = ..., failed_requests: _Optional[int] = ..., endpoint: _Optional[str] = ..., external: _Optional[bool] = ...) -> None: ...

class SubmitBatchJobRequest(_message.Message):
    __slots__ = ("pool_id", "total_requests", "deadline", "job_id")
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    TOTAL_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    pool_id: str
    total_requests: int
    deadline: _timestamp_pb2.Timestamp
    job_id: str
    def __init__(self, pool_id: _Optional[str] = ..., total_requests: _Optional[int] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., job_id: _Optional[str] = ...) -> None: ...

class GetBatchJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListBatchJobsRequest(_message.Message):
    __slots__ = ("pool_id",)
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    pool_id: str
    def __init__(self, pool_id: _Optional[str] = ...) -> None: ...

class ListBatchJobsResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[BatchJob]
    def __init__(self, jobs: _Optional[_Iterable[_Union[BatchJob, _Mapping]]] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("pool_id", "max_admission_rps", "valid_until_unix_ms", "decision_id", "writer_epoch", "writer_sequence")
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_ADMISSION_RPS_FIELD_NUMBER: _ClassVar[int]
    VALID_UNTIL_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    WRITER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    WRITER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    pool_id: str
    max_admission_rps: float
    valid_until_unix_ms: int
    decision_id: str
    writer_epoch: int
    writer_sequence: int
    def __init__(self, pool_id: _Optional[str] = ..., max_admission_rps: _Optional[float] = ..., valid_until_unix_ms: _Optional[int] = ..., decision_id: _Optional[str] = ..., writer_epoch: _Optional[int] = ..., writer_sequence: _Optional[int] = ...) -> None: ...

class GetLeaseRequest(_message.Message):
    __slots__ = ("pool_id",)
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    pool_id: str
    def __init__(self, pool_id: _Optional[str] = ...) -> None: ...

class WatchLeaseRequest(_message.Message):
    __slots__ = ("pool_id",)
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    pool_id: str
    def __init__(self, pool_id: _Optional[str] = ...) -> None: ...

class ReportDispatchRequest(_message.Message):
    __slots__ = ("pool_id", "dispatched", "completed", "queued", "inflight", "job_id", "failed", "actual_dispatch_rps", "applied_max_admission_rps", "has_applied_cap", "final_status")
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    DISPATCHED_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    ACTUAL_DISPATCH_RPS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_MAX_ADMISSION_RPS_FIELD_NUMBER: _ClassVar[int]
    HAS_APPLIED_CAP_FIELD_NUMBER: _ClassVar[int]
    FINAL_STATUS_FIELD_NUMBER: _ClassVar[int]
    pool_id: str
    dispatched: int
    completed: int
    queued: int
    inflight: int
    job_id: str
    failed: int
    actual_dispatch_rps: float
    applied_max_admission_rps: float
    has_applied_cap: bool
    final_status: str
    def __init__(self, pool_id: _Optional[str] = ..., dispatched: _Optional[int] = ..., completed: _Optional[int] = ..., queued: _Optional[int] = ..., inflight: _Optional[int] = ..., job_id: _Optional[str] = ..., failed: _Optional[int] = ..., actual_dispatch_rps: _Optional[float] = ..., applied_max_admission_rps: _Optional[float] = ..., has_applied_cap: _Optional[bool] = ..., final_status: _Optional[str] = ...) -> None: ...

class ReportDispatchResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReplicaTarget(_message.Message):
    __slots__ = ("pool_id", "replicas", "provenance", "reason", "source", "effect", "kind", "replayed")
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    PROVENANCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    EFFECT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    pool_id: str
    replicas: int
    provenance: Provenance
    reason: str
    source: str
    effect: str
    kind: str
    replayed: bool
    def __init__(self, pool_id: _Optional[str] = ..., replicas: _Optional[int] = ..., provenance: _Optional[_Union[Provenance, str]] = ..., reason: _Optional[str] = ..., source: _Optional[str] = ..., effect: _Optional[str] = ..., kind: _Optional[str] = ..., replayed: _Optional[bool] = ...) -> None: ...

class ObservationSummary(_message.Message):
    __slots__ = ("jobs_known", "active_jobs", "remaining_requests", "traffic_known", "online_offered_rps", "inventory_known", "ready_replicas", "desired_replicas", "pending_replicas", "scaling_in_progress", "feedback_known", "queued_requests", "inflight_requests", "actual_dispatch_rps", "programs_known", "paused_programs", "utilization", "source_errors")
    JOBS_KNOWN_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_JOBS_FIELD_NUMBER: _ClassVar[int]
    REMAINING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    TRAFFIC_KNOWN_FIELD_NUMBER: _ClassVar[int]
    ONLINE_OFFERED_RPS_FIELD_NUMBER: _ClassVar[int]
    INVENTORY_KNOWN_FIELD_NUMBER: _ClassVar[int]
    READY_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    DESIRED_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    PENDING_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    SCALING_IN_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    FEEDBACK_KNOWN_FIELD_NUMBER: _ClassVar[int]
    QUEUED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ACTUAL_DISPATCH_RPS_FIELD_NUMBER: _ClassVar[int]
    PROGRAMS_KNOWN_FIELD_NUMBER: _ClassVar[int]
    PAUSED_PROGRAMS_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_ERRORS_FIELD_NUMBER: _ClassVar[int]
    jobs_known: bool
    active_jobs: int
    remaining_requests: int
    traffic_known: bool
    online_offered_rps: float
    inventory_known: bool
    ready_replicas: int
    desired_replicas: int
    pending_replicas: int
    scaling_in_progress: bool
    feedback_known: bool
    queued_requests: int
    inflight_requests: int
    actual_dispatch_rps: float
    programs_known: bool
    paused_programs: int
    utilization: float
    source_errors: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, jobs_known: _Optional[bool] = ..., active_jobs: _Optional[int] = ..., remaining_requests: _Optional[int] = ..., traffic_known: _Optional[bool] = ..., online_offered_rps: _Optional[float] = ..., inventory_known: _Optional[bool] = ..., ready_replicas: _Optional[int] = ..., desired_replicas: _Optional[int] = ..., pending_replicas: _Optional[int] = ..., scaling_in_progress: _Optional[bool] = ..., feedback_known: _Optional[bool] = ..., queued_requests: _Optional[int] = ..., inflight_requests: _Optional[int] = ..., actual_dispatch_rps: _Optional[float] = ..., programs_known: _Optional[bool] = ..., paused_programs: _Optional[int] = ..., utilization: _Optional[float] = ..., source_errors: _Optional[_Iterable[str]] = ...) -> None: ...

class Plan(_message.Message):
    __slots__ = ("decision_id", "decided_at", "leases", "targets", "audit", "action", "fail_closed_reasons", "policy_reasons", "has_replica_floor", "replica_floor", "has_idle_target", "idle_target", "has_scale_to", "scale_to", "advisory", "effects_outcome", "effects_error", "required_batch_rps", "planned_batch_capacity_rps", "minimum_deadline_slack_s", "observation", "proposer_reasons", "tick_seconds")
    class ProposerReasonsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    AUDIT_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    FAIL_CLOSED_REASONS_FIELD_NUMBER: _ClassVar[int]
    POLICY_REASONS_FIELD_NUMBER: _ClassVar[int]
    HAS_REPLICA_FLOOR_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FLOOR_FIELD_NUMBER: _ClassVar[int]
    HAS_IDLE_TARGET_FIELD_NUMBER: _ClassVar[int]
    IDLE_TARGET_FIELD_NUMBER: _ClassVar[int]
    HAS_SCALE_TO_FIELD_NUMBER: _ClassVar[int]
    SCALE_TO_FIELD_NUMBER: _ClassVar[int]
    ADVISORY_FIELD_NUMBER: _ClassVar[int]
    EFFECTS_OUTCOME_FIELD_NUMBER: _ClassVar[int]
    EFFECTS_ERROR_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_BATCH_RPS_FIELD_NUMBER: _ClassVar[int]
    PLANNED_BATCH_CAPACITY_RPS_FIELD_NUMBER: _ClassVar[int]
    MINIMUM_DEADLINE_SLACK_S_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    PROPOSER_REASONS_FIELD_NUMBER: _ClassVar[int]
    TICK_SECONDS_FIELD_NUMBER: _ClassVar[int]
    decision_id: str
    decided_at: _timestamp_pb2.Timestamp
    leases: _containers.RepeatedCompositeFieldContainer[Lease]
    targets: _containers.RepeatedCompositeFieldContainer[ReplicaTarget]
    audit: _containers.RepeatedScalarFieldContainer[str]
    action: str
    fail_closed_reasons: _containers.RepeatedScalarFieldContainer[str]
    policy_reasons: _containers.RepeatedScalarFieldContainer[str]
    has_replica_floor: bool
    replica_floor: int
    has_idle_target: bool
    idle_target: int
    has_scale_to: bool
    scale_to: int
    advisory: bool
    effects_outcome: str
    effects_error: str
    required_batch_rps: float
    planned_batch_capacity_rps: float
    minimum_deadline_slack_s: float
    observation: ObservationSummary
    proposer_reasons: _containers.ScalarMap[str, str]
    tick_seconds: float
    def __init__(self, decision_id: _Optional[str] = ..., decided_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., leases: _Optional[_Iterable[_Union[Lease, _Mapping]]] = ..., targets: _Optional[_Iterable[_Union[ReplicaTarget, _Mapping]]] = ..., audit: _Optional[_Iterable[str]] = ..., action: _Optional[str] = ..., fail_closed_reasons: _Optional[_Iterable[str]] = ..., policy_reasons: _Optional[_Iterable[str]] = ..., has_replica_floor: _Optional[bool] = ..., replica_floor: _Optional[int] = ..., has_idle_target: _Optional[bool] = ..., idle_target: _Optional[int] = ..., has_scale_to: _Optional[bool] = ..., scale_to: _Optional[int] = ..., advisory: _Optional[bool] = ..., effects_outcome: _Optional[str] = ..., effects_error: _Optional[str] = ..., required_batch_rps: _Optional[float] = ..., planned_batch_capacity_rps: _Optional[float] = ..., minimum_deadline_slack_s: _Optional[float] = ..., observation: _Optional[_Union[ObservationSummary, _Mapping]] = ..., proposer_reasons: _Optional[_Mapping[str, str]] = ..., tick_seconds: _Optional[float] = ...) -> None: ...

class GetPlanRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
