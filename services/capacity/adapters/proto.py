"""Domain <-> protobuf. Protobuf types stop here; the core sees dataclasses."""

from __future__ import annotations

import math

from bandmaster.capacity.v1 import capacity_pb2 as pb
from services.capacity.core.cards import CapacityView, ReplicaView, WorkerView
from services.capacity.core.errors import InvalidArgument
from services.capacity.core.state import Card, Degradation, Expectation, Health, Load, Origin, RetentionSource

_HEALTH = {
    Health.PENDING: pb.WORKER_HEALTH_PENDING,
    Health.HEALTHY: pb.WORKER_HEALTH_HEALTHY,
    Health.UNHEALTHY: pb.WORKER_HEALTH_UNHEALTHY,
}
_ORIGIN = {
    Origin.FLAG: pb.WORKER_ORIGIN_FLAG,
    Origin.CONFIG_FILE: pb.WORKER_ORIGIN_CONFIG_FILE,
    Origin.RPC: pb.WORKER_ORIGIN_RPC,
}
_SOURCE = {
    RetentionSource.GPU_ONLY: pb.RETENTION_SOURCE_GPU_ONLY,
    RetentionSource.GPU_PLUS_HOST: pb.RETENTION_SOURCE_GPU_PLUS_HOST,
}
_DEGRADATION = {
    Degradation.CACHE_REPORT_OFF: pb.DEGRADATION_CACHE_REPORT_OFF,
    Degradation.PRIORITY_SCHEDULING_OFF: pb.DEGRADATION_PRIORITY_SCHEDULING_OFF,
}
_INT32_MAX = 2**31 - 1


def card_to_proto(card: Card) -> pb.WorkerCard:
    return pb.WorkerCard(
        model_name=card.model_name,
        gpu_kv_tokens=card.gpu_kv_tokens,
        page_size=card.page_size,
        host_kv_tokens=card.host_kv_tokens,
        hierarchical_cache=card.hierarchical_cache,
        hicache_write_policy=card.hicache_write_policy,
        hicache_storage_backend=card.hicache_storage_backend,
        dp_size=card.dp_size,
        max_running_requests=card.max_running_requests,
        context_length=card.context_length,
        version=card.version,
        degraded=[_DEGRADATION[d] for d in card.degraded],
    )


def replica_to_proto(r: ReplicaView) -> pb.Replica:
    return pb.Replica(
        worker_id=r.worker_id,
        dp_rank=r.dp_rank,
        retention_tokens=r.retention_tokens,
        retention_source=_SOURCE[r.source],
        gpu_kv_tokens=r.gpu_kv_tokens,
        host_kv_tokens=r.host_kv_tokens,
        max_programs=r.max_programs,
    )


def load_to_proto(load: Load) -> pb.WorkerLoad:
    return pb.WorkerLoad(
        num_running_reqs=load.num_running_reqs,
        num_queue_reqs=load.num_queue_reqs,
        token_usage=load.token_usage,
        cache_hit_rate=load.cache_hit_rate,
    )


def worker_to_proto(view: WorkerView) -> pb.Worker:
    s = view.state
    worker = pb.Worker(
        worker_id=s.worker_id,
        url=s.url,
        origin=_ORIGIN[s.origin],
        health=_HEALTH[s.health],
        replicas=[replica_to_proto(r) for r in view.replicas],
        load=load_to_proto(s.load),
        excluded_reason=view.excluded_reason,
        consecutive_failures=min(s.consecutive_failures, _INT32_MAX),
    )
    if s.card is not None:
        worker.card.CopyFrom(card_to_proto(s.card))
    if s.last_success_wall is not None:
        worker.last_success.FromNanoseconds(int(s.last_success_wall * 1e9))
    return worker


def snapshot_to_proto(
    view: CapacityView, version: int, generated_at_wall: float, heartbeat: bool = False
) -> pb.WorkersSnapshot:
    snap = pb.WorkersSnapshot(
        version=version,
        workers=[worker_to_proto(w) for w in view.workers],
        total_retention_tokens=view.total_retention_tokens,
        heartbeat=heartbeat,
    )
    snap.generated_at.FromNanoseconds(int(generated_at_wall * 1e9))
    return snap


def load_from_proto(msg: pb.WorkerLoad) -> Load:
    """Validate a reported load: counts >= 0, fractions finite in [0, 1]."""
    if msg.num_running_reqs < 0 or msg.num_queue_reqs < 0:
        raise InvalidArgument("load: request counts must be >= 0")
    for name in ("token_usage", "cache_hit_rate"):
        value = getattr(msg, name)
        if not math.isfinite(value) or not 0.0 <= value <= 1.0:
            raise InvalidArgument(f"load.{name} must be within [0, 1], got {value}")
    return Load(msg.num_running_reqs, msg.num_queue_reqs, msg.token_usage, msg.cache_hit_rate)


def expectation_from_proto(req: pb.RegisterWorkerRequest) -> Expectation:
    if req.expected_gpu_kv_tokens < 0 or req.expected_page_size < 0:
        raise InvalidArgument("expected_gpu_kv_tokens and expected_page_size must be >= 0 (0 = no expectation)")
    return Expectation(gpu_kv_tokens=req.expected_gpu_kv_tokens, page_size=req.expected_page_size)
