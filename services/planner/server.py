"""Composition root: config -> job store, lease store, connector, sources, runtime and gRPC servicer,
started in the fail-closed order:

    1. the zero-rate start-up lease (nothing else runs before it; an unreachable store refuses
       to start with a message naming it)
    2. the connector (the Kubernetes writer fence), gRPC
    3. the tick loop

The planner is control only: batch requests are dispatched by the batch service (`python -m
services.batch`), which submits jobs, follows the lease and reports progress over gRPC.

and stopped in reverse: the tick loop, then the shutdown zero lease, then the rest.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import grpc
from opentelemetry import trace

from bandmaster.planner.v1 import planner_pb2_grpc as pb_grpc
from services.common.auth.redact import redact_url
from services.common.clock import Clock, SystemClock
from services.common.observe.telemetry import Telemetry
from services.common.process.ready import write_ready_file
from services.common.serve.grpc_server import ServiceHost
from services.common.settings.errors import ConfigError
from services.planner.adapters.connectors import (
    Connector,
    KubernetesConnector,
    KubernetesTarget,
    LocalConnector,
    VirtualConnector,
)
from services.planner.adapters.jobs import JobStore
from services.planner.adapters.lease_store import LeaseStore, LeaseStoreError, MemoryLeaseStore, RedisLeaseStore
from services.planner.adapters.observe import CapacitySource, Collector, RouterTrafficSource, SchedulerSource
from services.planner.adapters.profile import load_engine_profile
from services.planner.config import PlannerConfig
from services.planner.core.batch_policy import BatchPolicyConfig
from services.planner.core.scaling import LoadScalingConfig, ProgramScalingConfig, ThroughputScalingConfig
from services.planner.core.throughput import engine_rps
from services.planner.core.tick import Budgets, TickSettings
from services.planner.loop import PlannerRuntime
from services.planner.metrics import PlannerMetrics
from services.planner.servicer import SERVICE_NAME, PlannerServicer

log = logging.getLogger("services.planner")


@dataclass
class RunningPlanner:
    host: ServiceHost
    runtime: PlannerRuntime
    jobs: JobStore
    store: LeaseStore
    connector: Connector
    servicer: PlannerServicer
    config: PlannerConfig

    @property
    def address(self) -> str:
        return self.host.address

    async def stop(self) -> None:
        await self.host.stop()


def build_settings(config: PlannerConfig) -> TickSettings:
    profile = load_engine_profile(config.timing_profile)
    profile.check_model(config.worker_model)
    engine = engine_rps(profile, config.throughput_isl, config.throughput_osl, config.itl_ms)
    safe = config.safe_rps_per_replica
    if safe <= 0:
        if engine.rps <= 0:
            raise ConfigError(
                "safe_rps_per_replica",
                0,
                f"the timing profile {profile.name} meets itl_ms="
                f"{config.itl_ms:g} at no batch size; give --safe-rps-per-replica",
            )
        safe = engine.rps * config.safe_rps_fraction
        log.info(
            "safe rate per replica %.3g rps (%.0f%% of %.3g rps from profile %s at isl=%d osl=%d itl<=%gms)",
            safe,
            config.safe_rps_fraction * 100,
            engine.rps,
            profile.name,
            config.throughput_isl,
            config.throughput_osl,
            config.itl_ms,
        )
    batch = BatchPolicyConfig(
        pool_id=config.pool_id,
        work_class=config.work_class,
        safe_rps_per_ready_replica=safe,
        cold_start_margin_s=config.cold_start_margin_seconds,
        finalization_margin_s=config.finalization_margin_seconds,
        max_observation_age_s=config.max_observation_age_seconds,
        drain_lease_duration_s=config.drain_lease_duration_seconds,
        min_replicas=config.min_replicas,
        max_replicas=config.max_replicas,
        scale_from_zero_replicas=config.scale_from_zero_replicas,
        max_batch_admission_rps=None if config.max_batch_admission_rps < 0 else config.max_batch_admission_rps,
    )
    return TickSettings(
        batch=batch,
        load=LoadScalingConfig(
            enabled=config.enable_load_scaling and bool(config.capacity),
            scale_up_kv_usage=config.load_scale_up_kv_usage,
            scale_down_kv_usage=config.load_scale_down_kv_usage,
            scale_up_queued=config.load_scale_up_queued,
        ),
        throughput=ThroughputScalingConfig(
            enabled=config.enable_throughput_scaling,
            interval_s=config.throughput_interval_seconds,
            as_lower_bound=config.enable_load_scaling and bool(config.capacity),
        ),
        programs=ProgramScalingConfig(
            enabled=config.enable_program_scaling and bool(config.scheduler),
            pause_window_s=config.program_pause_window_seconds,
            utilization_window_s=config.utilization_window_seconds,
            scale_up_utilization=config.scale_up_utilization,
            scale_down_utilization=config.scale_down_utilization,
        ),
        engine=engine,
        budgets=Budgets(
            gpus_per_replica=config.gpus_per_replica,
            max_gpu_budget=config.max_gpu_budget,
            watts_per_replica=config.watts_per_replica,
            total_power_limit_w=config.total_power_limit_watts,
        ),
        startup_reduction_window_s=config.startup_reduction_window_seconds,
    )


def _write_ready_file(path: str, running: RunningPlanner) -> None:
    write_ready_file(
        path,
        {
            "service": "planner",
            "grpc": running.address,
            "metrics_port": running.host.metrics_port,
            "pid": os.getpid(),
        },
    )


async def start_planner(
    config: PlannerConfig,
    *,
    telemetry: Telemetry | None = None,
    clock: Clock | None = None,
    store: LeaseStore | None = None,
    connector: Connector | None = None,
) -> RunningPlanner:
    clock = clock or SystemClock()
    settings = build_settings(config)
    host = ServiceHost(
        "planner",
        listen=config.listen,
        metrics_port=config.metrics_port,
        telemetry=telemetry,
        shutdown_grace_seconds=config.shutdown_grace_seconds,
        security=config.security,
    )
    tracer = telemetry.tracer("services.planner") if telemetry else trace.get_tracer("services.planner")
    metrics = PlannerMetrics(host.registry)
    channels: list[grpc.aio.Channel] = []

    def stub(address: str, module):
        channel = config.security.channel(address)
        channels.append(channel)
        return module(channel)

    capacity_stub = None
    if config.capacity:
        from bandmaster.capacity.v1 import capacity_pb2_grpc as cap_grpc

        capacity_stub = stub(config.capacity, cap_grpc.CapacityStub)
    scheduler_stub = None
    if config.scheduler:
        from bandmaster.scheduler.v1 import scheduler_pb2_grpc as sched_grpc
        from services.common.outbound.leader_follow import FollowingStub, parse_addresses

        def scheduler_channel(address: str) -> grpc.aio.Channel:
            channels.append(channel := config.security.channel(address))
            return channel

        # Active/standby schedulers: every replica's address, the calls follow the leader.
        scheduler_stub = FollowingStub(
            parse_addresses(config.scheduler, "scheduler"), scheduler_channel, sched_grpc.SchedulerStub
        )

    if store is None:
        if config.lease_store == "redis":
            store = RedisLeaseStore(
                config.redis_url,
                config.control_key,
                connect_timeout_s=config.redis_connect_timeout_seconds,
                socket_timeout_s=config.redis_socket_timeout_seconds,
            )
        else:
            store = MemoryLeaseStore()
    if connector is None:
        connector = _connector(config, clock, capacity_stub)
    job_store = JobStore(config.registry_path)
    servicer_ref: list[PlannerServicer] = []

    def feedback():
        return servicer_ref[0].external_feedback if servicer_ref else None

    router = None
    if config.router_metrics_url:
        router = RouterTrafficSource(
            config.router_metrics_url,
            clock,
            timeout_s=config.observe_timeout_seconds,
            metrics_token=_metrics_token(config),
        )

    def jobs(now_mono: float):
        # Jobs past their deadline expire on the tick (the dispatcher may be gone).
        _log_transitions(job_store.advance(int(clock.wall())), metrics)
        return job_store.job_demands(now_mono, config.work_class)

    collector = Collector(
        clock,
        jobs=jobs,
        inventory=connector.inventory,
        timeout_s=config.observe_timeout_seconds,
        feedback=feedback,
        router=router,
        scheduler=SchedulerSource(scheduler_stub, clock, timeout_s=config.observe_timeout_seconds)
        if scheduler_stub
        else None,
        capacity=CapacitySource(capacity_stub, timeout_s=config.observe_timeout_seconds) if capacity_stub else None,
        assume_no_online_traffic=config.assume_no_online_traffic,
    )
    runtime = PlannerRuntime(
        settings=settings,
        collector=collector,
        store=store,
        connector=connector,
        clock=clock,
        metrics=metrics,
        tracer=tracer,
        interval_s=config.tick_interval_seconds,
        tick_max_duration_s=config.tick_max_duration_seconds,
        effect_timeout_s=config.effect_timeout_seconds,
        advisory=config.advisory,
    )

    async def close_all() -> None:
        await runtime.stop()  # the tick loop, then the shutdown zero lease
        await connector.stop()
        await store.close()
        if router is not None:
            await router.close()
        for channel in channels:
            await channel.close()
        job_store.close()

    # 1. The zero lease before anything else.
    try:
        await runtime.start_lease()
    except (LeaseStoreError, TimeoutError, OSError) as exc:
        await store.close()
        job_store.close()
        where = redact_url(config.redis_url) if config.lease_store == "redis" else config.lease_store
        raise ConfigError(
            "redis_url" if config.lease_store == "redis" else "lease_store",
            where,
            f"the lease store is unreachable at start-up, refusing to start ({exc})",
        ) from None
    servicer = PlannerServicer(runtime, job_store, clock)
    servicer_ref.append(servicer)
    pb_grpc.add_PlannerServicer_to_server(servicer, host.server)
    host.add_service(SERVICE_NAME)
    host.on_stop(close_all)
    try:
        # 2. The connector (writer fence), gRPC.
        await connector.start()
        await host.start()
    except BaseException:
        await close_all()
        raise
    # 3. The tick loop.
    runtime.start()
    running = RunningPlanner(host, runtime, job_store, store, connector, servicer, config)
    log.info(
        "planner: pool %s, connector %s, lease store %s%s, gRPC on %s",
        config.pool_id,
        connector.name,
        store.name,
        " (advisory)" if config.advisory else "",
        running.address,
    )
    _write_ready_file(config.ready_file, running)
    return running


def _metrics_token(config: PlannerConfig) -> str:
    """What the planner presents to the routers' /metrics: its metrics token, else its control token (a
    guarded /metrics accepts either), else nothing."""
    tokens = config.security.metrics_tokens or config.security.control_tokens
    return tokens.first if tokens is not None else ""


def _log_transitions(moved: list, metrics: PlannerMetrics) -> None:
    for batch_id, old, new in moved:
        metrics.batches.labels(new).inc()
        log.info("job %s: %s -> %s", batch_id, old, new)


def _connector(config: PlannerConfig, clock: Clock, capacity_stub) -> Connector:
    if config.connector == "virtual":
        return VirtualConnector(
            clock, initial_replicas=config.virtual_initial_replicas, ready_delay_s=config.virtual_ready_delay_seconds
        )
    if config.connector == "local":
        register = deregister = None
        if capacity_stub is not None:
            from bandmaster.capacity.v1 import capacity_pb2 as cpb

            async def register(worker_id: str, url: str) -> None:
                await capacity_stub.RegisterWorker(
                    cpb.RegisterWorkerRequest(url=url, worker_id=worker_id), timeout=config.observe_timeout_seconds
                )

            async def deregister(worker_id: str) -> None:
                await capacity_stub.DeregisterWorker(
                    cpb.DeregisterWorkerRequest(worker_id=worker_id), timeout=config.observe_timeout_seconds
                )

        return LocalConnector(
            clock,
            worker_args=config.local_worker_arg,
            max_workers=config.local_max_workers,
            register=register,
            deregister=deregister,
        )
    try:
        import kubernetes  # noqa: F401  (the connector imports it when it first calls the API server)
    except ModuleNotFoundError as exc:
        if exc.name != "kubernetes":
            raise
        raise ConfigError(
            "connector",
            "kubernetes",
            "--connector kubernetes needs the Kubernetes client, an optional dependency: "
            "pip install 'bandmaster[kubernetes]' (the container image has it)",
        ) from None
    return KubernetesConnector(
        clock,
        KubernetesTarget(
            config.k8s_deployment,
            config.k8s_namespace,
            config.k8s_api_server,
            request_timeout_s=config.effect_timeout_seconds,
            writer_fence=config.k8s_writer_fence,
        ),
    )
