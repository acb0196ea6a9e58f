import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RetentionSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RETENTION_SOURCE_UNSPECIFIED: _ClassVar[RetentionSource]
    RETENTION_SOURCE_GPU_ONLY: _ClassVar[RetentionSource]
    RETENTION_SOURCE_GPU_PLUS_HOST: _ClassVar[RetentionSource]

class WorkerHealth(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKER_HEALTH_UNSPECIFIED: _ClassVar[WorkerHealth]
    WORKER_HEALTH_PENDING: _ClassVar[WorkerHealth]
    WORKER_HEALTH_HEALTHY: _ClassVar[WorkerHealth]
    WORKER_HEALTH_UNHEALTHY: _ClassVar[WorkerHealth]

class WorkerOrigin(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKER_ORIGIN_UNSPECIFIED: _ClassVar[WorkerOrigin]
    WORKER_ORIGIN_FLAG: _ClassVar[WorkerOrigin]
    WORKER_ORIGIN_CONFIG_FILE: _ClassVar[WorkerOrigin]
    WORKER_ORIGIN_RPC: _ClassVar[WorkerOrigin]

class Degradation(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DEGRADATION_UNSPECIFIED: _ClassVar[Degradation]
    DEGRADATION_CACHE_REPORT_OFF: _ClassVar[Degradation]
    DEGRADATION_PRIORITY_SCHEDULING_OFF: _ClassVar[Degradation]
RETENTION_SOURCE_UNSPECIFIED: RetentionSource
RETENTION_SOURCE_GPU_ONLY: RetentionSource
RETENTION_SOURCE_GPU_PLUS_HOST: RetentionSource
WORKER_HEALTH_UNSPECIFIED: WorkerHealth
WORKER_HEALTH_PENDING: WorkerHealth
WORKER_HEALTH_HEALTHY: WorkerHealth
WORKER_HEALTH_UNHEALTHY: WorkerHealth
WORKER_ORIGIN_UNSPECIFIED: WorkerOrigin
WORKER_ORIGIN_FLAG: WorkerOrigin
WORKER_ORIGIN_CONFIG_FILE: WorkerOrigin
WORKER_ORIGIN_RPC: WorkerOrigin
DEGRADATION_UNSPECIFIED: Degradation
DEGRADATION_CACHE_REPORT_OFF: Degradation
DEGRADATION_PRIORITY_SCHEDULING_OFF: Degradation

class WorkerCard(_message.Message):
    __slots__ = ("model_name", "gpu_kv_tokens", "page_size", "host_kv_tokens", "hierarchical_cache", "hicache_write_policy", "hicache_storage_backend", "dp_size", "max_running_requests", "context_length", "version", "degraded")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    GPU_KV_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    HOST_KV_TOKENS_FIELD_NUMBER: _ClassVar[int]
    HIERARCHICAL_CACHE_FIELD_NUMBER: _ClassVar[int]
    HICACHE_WRITE_POLICY_FIELD_NUMBER: _ClassVar[int]
    HICACHE_STORAGE_BACKEND_FIELD_NUMBER: _ClassVar[int]
    DP_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    gpu_kv_tokens: int
    page_size: int
    host_kv_tokens: int
    hierarchical_cache: bool
    hicache_write_policy: str
    hicache_storage_backend: str
    dp_size: int
    max_running_requests: int
    context_length: int
    version: str
    degraded: _containers.RepeatedScalarFieldContainer[Degradation]
    def __init__(self, model_name: _Optional[str] = ..., gpu_kv_tokens: _Optional[int] = ..., page_size: _Optional[int] = ..., host_kv_tokens: _Optional[int] = ..., hierarchical_cache: _Optional[bool] = ..., hicache_write_policy: _Optional[str] = ..., hicache_storage_backend: _Optional[str] = ..., dp_size: _Optional[int] = ..., max_running_requests: _Optional[int] = ..., context_length: _Optional[int] = ..., version: _Optional[str] = ..., degraded: _Optional[_Iterable[_Union[Degradation, str]]] = ...) -> None: ...

class Replica(_message.Message):
    __slots__ = ("worker_id", "dp_rank", "retention_tokens", "retention_source", "gpu_kv_tokens", "host_kv_tokens", "max_programs")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    RETENTION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RETENTION_SOURCE_FIELD_NUMBER: _ClassVar[int]
    GPU_KV_TOKENS_FIELD_NUMBER: _ClassVar[int]
    HOST_KV_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_PROGRAMS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    dp_rank: int
    retention_tokens: int
    retention_source: RetentionSource
    gpu_kv_tokens: int
    host_kv_tokens: int
    max_programs: int
    def __init__(self, worker_id: _Optional[str] = ..., dp_rank: _Optional[int] = ..., retention_tokens: _Optional[int] = ..., retention_source: _Optional[_Union[RetentionSource, str]] = ..., gpu_kv_tokens: _Optional[int] = ..., host_kv_tokens: _Optional[int] = ..., max_programs: _Optional[int] = ...) -> None: ...

class WorkerLoad(_message.Message):
    __slots__ = ("num_running_reqs", "num_queue_reqs", "token_usage", "cache_hit_rate")
    NUM_RUNNING_REQS_FIELD_NUMBER: _ClassVar[int]
    NUM_QUEUE_REQS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_USAGE_FIELD_NUMBER: _ClassVar[int]
    CACHE_HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    num_running_reqs: int
    num_queue_reqs: int
    token_usage: float
    cache_hit_rate: float
    def __init__(self, num_running_reqs: _Optional[int] = ..., num_queue_reqs: _Optional[int] = ..., token_usage: _Optional[float] = ..., cache_hit_rate: _Optional[float] = ...) -> None: ...

class Worker(_message.Message):
    __slots__ = ("worker_id", "url", "origin", "health", "card", "replicas", "load", "excluded_reason", "consecutive_failures", "last_success")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    CARD_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_REASON_FIELD_NUMBER: _ClassVar[int]
    CONSECUTIVE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    LAST_SUCCESS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    url: str
    origin: WorkerOrigin
    health: WorkerHealth
    card: WorkerCard
    replicas: _containers.RepeatedCompositeFieldContainer[Replica]
    load: WorkerLoad
    excluded_reason: str
    consecutive_failures: int
    last_success: _timestamp_pb2.Timestamp
    def __init__(self, worker_id: _Optional[str] = ..., url: _Optional[str] = ..., origin: _Optional[_Union[WorkerOrigin, str]] = ..., health: _Optional[_Union[WorkerHealth, str]] = ..., card: _Optional[_Union[WorkerCard, _Mapping]] = ..., replicas: _Optional[_Iterable[_Union[Replica, _Mapping]]] = ..., load: _Optional[_Union[WorkerLoad, _Mapping]] = ..., excluded_reason: _Optional[str] = ..., consecutive_failures: _Optional[int] = ..., last_success: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class WorkersSnapshot(_message.Message):
    __slots__ = ("version", "workers", "total_retention_tokens", "generated_at", "heartbeat")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_RETENTION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_AT_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    version: int
    workers: _containers.RepeatedCompositeFieldContainer[Worker]
    total_retention_tokens: int
    generated_at: _timestamp_pb2.Timestamp
    heartbeat: bool
    def __init__(self, version: _Optional[int] = ..., workers: _Optional[_Iterable[_Union[Worker, _Mapping]]] = ..., total_retention_tokens: _Optional[int] = ..., generated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., heartbeat: _Optional[bool] = ...) -> None: ...

class RegisterWorkerRequest(_message.Message):
    __slots__ = ("url", "worker_id", "expected_gpu_kv_tokens", "expected_page_size")
    URL_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_GPU_KV_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    url: str
    worker_id: str
    expected_gpu_kv_tokens: int
    expected_page_size: int
    def __init__(self, url: _Optional[str] = ..., worker_id: _Optional[str] = ..., expected_gpu_kv_tokens: _Optional[int] = ..., expected_page_size: _Optional[int] = ...) -> None: ...

class RegisterWorkerResponse(_message.Message):
    __slots__ = ("worker",)
    WORKER_FIELD_NUMBER: _ClassVar[int]
    worker: Worker
    def __init__(self, worker: _Optional[_Union[Worker, _Mapping]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("worker_id", "load")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    load: WorkerLoad
    def __init__(self, worker_id: _Optional[str] = ..., load: _Optional[_Union[WorkerLoad, _Mapping]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("known",)
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    known: bool
    def __init__(self, known: _Optional[bool] = ...) -> None: ...

class DeregisterWorkerRequest(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ...) -> None: ...

class DeregisterWorkerResponse(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: bool
    def __init__(self, removed: _Optional[bool] = ...) -> None: ...

class ListWorkersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchWorkersRequest(_message.Message):
    __slots__ = ("known_version",)
    KNOWN_VERSION_FIELD_NUMBER: _ClassVar[int]
    known_version: int
    def __init__(self, known_version: _Optional[int] = ...) -> None: ...

class ReplicaActiveLoad(_message.Message):
    __slots__ = ("worker_id", "dp_rank", "active_requests", "prefill_tokens", "decode_blocks")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    DP_RANK_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DECODE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    dp_rank: int
    active_requests: int
    prefill_tokens: int
    decode_blocks: int
    def __init__(self, worker_id: _Optional[str] = ..., dp_rank: _Optional[int] = ..., active_requests: _Optional[int] = ..., prefill_tokens: _Optional[int] = ..., decode_blocks: _Optional[int] = ...) -> None: ...

class RouterLoadReport(_message.Message):
    __slots__ = ("router_id", "sequence", "ttl_ms", "loads")
    ROUTER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    LOADS_FIELD_NUMBER: _ClassVar[int]
    router_id: str
    sequence: int
    ttl_ms: int
    loads: _containers.RepeatedCompositeFieldContainer[ReplicaActiveLoad]
    def __init__(self, router_id: _Optional[str] = ..., sequence: _Optional[int] = ..., ttl_ms: _Optional[int] = ..., loads: _Optional[_Iterable[_Union[ReplicaActiveLoad, _Mapping]]] = ...) -> None: ...

class ReportRouterLoadResponse(_message.Message):
    __slots__ = ("accepted",)
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    def __init__(self, accepted: _Optional[bool] = ...) -> None: ...

class WatchRouterLoadsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RouterLoadsSnapshot(_message.Message):
    __slots__ = ("version", "routers")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ROUTERS_FIELD_NUMBER: _ClassVar[int]
    version: int
    routers: _containers.RepeatedCompositeFieldContainer[RouterLoadReport]
    def __init__(self, version: _Optional[int] = ..., routers: _Optional[_Iterable[_Union[RouterLoadReport, _Mapping]]] = ...) -> None: ...
