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
PROVENANCE_UNSPECIFIED: Provenance
PROVENANCE_PROPOSE: Provenance
PROVENANCE_RECONCILE: Provenance
PROVENANCE_CONSTRAIN: Provenance
PROVENANCE_FAIL_CLOSED: Provenance

class BatchJob(_message.Message):
    __slots__ = ("job_id", "pool_id", "total_requests", "dispatched_requests", "completed_requests", "deadline", "state", "submitted_at")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    TOTAL_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    DISPATCHED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    pool_id: str
    total_requests: int
    dispatched_requests: int
    completed_requests: int
    deadline: _timestamp_pb2.Timestamp
    state: BatchJobState
    submitted_at: _timestamp_pb2.Timestamp
    def __init__(self, job_id: _Optional[str] = ..., pool_id: _Optional[str] = ..., total_requests: _Optional[int] = ..., dispatched_requests: _Optional[int] = ..., completed_requests: _Optional[int] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., state: _Optional[_Union[BatchJobState, str]] = ..., submitted_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

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
    __slots__ = ("pool_id", "dispatched", "completed", "queued", "inflight")
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    DISPATCHED_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    pool_id: str
    dispatched: int
    completed: int
    queued: int
    inflight: int
    def __init__(self, pool_id: _Optional[str] = ..., dispatched: _Optional[int] = ..., completed: _Optional[int] = ..., queued: _Optional[int] = ..., inflight: _Optional[int] = ...) -> None: ...

class ReportDispatchResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReplicaTarget(_message.Message):
    __slots__ = ("pool_id", "replicas", "provenance", "reason")
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    PROVENANCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    pool_id: str
    replicas: int
    provenance: Provenance
    reason: str
    def __init__(self, pool_id: _Optional[str] = ..., replicas: _Optional[int] = ..., provenance: _Optional[_Union[Provenance, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class Plan(_message.Message):
    __slots__ = ("decision_id", "decided_at", "leases", "targets", "audit")
    DECISION_ID_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    AUDIT_FIELD_NUMBER: _ClassVar[int]
    decision_id: str
    decided_at: _timestamp_pb2.Timestamp
    leases: _containers.RepeatedCompositeFieldContainer[Lease]
    targets: _containers.RepeatedCompositeFieldContainer[ReplicaTarget]
    audit: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, decision_id: _Optional[str] = ..., decided_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., leases: _Optional[_Iterable[_Union[Lease, _Mapping]]] = ..., targets: _Optional[_Iterable[_Union[ReplicaTarget, _Mapping]]] = ..., audit: _Optional[_Iterable[str]] = ...) -> None: ...

class GetPlanRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
