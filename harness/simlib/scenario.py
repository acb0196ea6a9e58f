"""What one simulated run is: the arm, the workload, the workers, the control plane's settings.

`SimScenario` is frozen and validated on construction (ConfigError naming the rule). The worker
side is built exactly as `bandmaster up` builds it (services/launcher/cluster.py `simworker_spec` -> the
simworker's flags -> services/simworker/core/build.py `build_engine`, which the server calls too), and
the retention budget exactly as the capacity service derives it from the worker's /server_info
(services/capacity/core/cards.py). Only the services' cores are imported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Sequence

from clients.player import SYSTEM_PROMPT_TOKENS, build_workload, split_source
from clients.workloads import DEFAULT_DRAW, DEFAULT_SPLIT, DRAWS, SPLITS, Program
from harness.peers import ContinuumCore, ContinuumParams, PeerPolicy, ThunderAgentCore, ThunderAgentParams
from harness.peers.continuum import prefill_reload_s
from harness.simlib.live_path import LivePathCosts
from services.capacity.core.cards import RetentionSettings, derive_card, replicas_for
from services.capacity.core.state import CardRejection
from services.common.settings.config import require
from services.router.core.params import KvRouterParams
from services.scheduler.core.defaults import (
    SERVICE_DEFAULT_PAUSE_POLICY,
    KvRouterConfig,
    check_policy_settings,
    service_control_params,
)
from services.scheduler.core.model import ReplicaCapacity
from services.scheduler.core.params import ControlParams
from services.scheduler.core.policies import PAUSE_POLICIES, CostAwarePauseParams, make_pause_policy
from services.simworker.core.api import Engine, EngineConfig
from services.simworker.core.build import DEFAULT_MODEL_PATH, build_engine, host_total_tokens
from services.simworker.core.timing import TimingProfile
from services.simworker.profiles import load_profile

ARMS = ("bandmaster", "kv", "round_robin", "oracle", "thunderagent", "continuum")
# Arms that are a peer system's policy core (harness/peers) in front of the workers, no KV router.
PEER_ARMS = ("thunderagent", "continuum")
WORKLOADS = ("swe", "synthetic", "short")
ROUTER_PROMPT_MODES = ("text", "tokens")

# Router constants that the live stack counts in wall seconds (services/router/config.py,
# services/router/core/params.py; the history TTL is kv_router.router_ttl_secs). Under
# `live_speedup` they are that many times longer in virtual time, as they are in a live run
# against simworkers at that --speedup.
ROUTER_REQUEST_EXPIRY_WALL_S = 300.0
ROUTER_SWEEP_WALL_S = 5.0
# The oracle's pool (see SimScenario.oracle_worker_kv_tokens): at least this many times the
# scenario's, and at least what every program of the run holds at once, with every answer it
# generated (a dead branch: the chat template re-renders the answer) and this many tokens per turn
# for the template's role markers and partly filled pages.
ORACLE_POOL_FACTOR = 10
ORACLE_SLACK_TOKENS_PER_TURN = 64

# `bandmaster up` never ticks the scheduler faster than this (wall seconds).
SCHEDULER_MIN_INTERVAL_WALL_S = 0.05


@dataclass(frozen=True)
class SimScenario:
    """One run. Times are in simulated (modelled-hardware) seconds unless the name says wall."""

    arm: str = "bandmaster"
    """bandmaster (scheduler core + router core), kv (router core only), round_robin, oracle (the kv
    arm with effectively unlimited GPU KV: nothing is ever evicted; see `oracle_worker_kv_tokens`)."""
    workload: str = "swe"
    trace: str | None = None
    """JSONL trace in shared/traces/swe_agent_trace.jsonl's format for the swe and synthetic
    workloads; None = the shipped SWE-agent programs."""
    split: str = DEFAULT_SPLIT
    """Part of the trace the programs come from: tune, heldout or all (clients/workloads/draws.py)."""
    draw: str = DEFAULT_DRAW
    """stratified (the trace's size mix) or random (uniform with replacement, seeded by `seed`)."""
    include_longest: bool = False
    """Make sure the draw holds the split's longest program."""
    programs: int = 8
    parallel: int = 0
    """Programs in flight at once (0 = all), as clients/player.py --parallel."""
    max_turns: int | None = None
    token_scale: float = 1.0
    tool_time_scale: float = 1.0
    seed: int = 0
    """Workload seed (synthetic workloads, new-message texts) and the router's random source."""
    variant: int = 0
    """Another draw of the run's own randomness on the same workload (the programs, their order, sizes
    and tool times stay `seed`'s): the router's random source, the new-message texts and, with
    `live_path`, each turn's path costs, which vary around their means from turn to turn as live
    ones do (harness/simlib/simulator.py `_path_s`). 0 is the run `seed` alone has always given, with
    the path's mean costs. A run hangs on a few control decisions that small differences in timing move:
    comparing a live run with the median over variants compares it with what the simulator expects of
    such runs, not with one draw of them."""

    workers: int = 2
    worker_kv_tokens: int = 65_536
    worker_host_kv_tokens: int = 0
    worker_page_size: int = 16
    worker_timing_profile: str = "glm45-fp8-h200"
    worker_max_running_requests: int = 256
    worker_chunked_prefill_size: int = 8_192
    worker_context_length: int = 131_072

    control: ControlParams | None = None
    """The scheduler's control law (bandmaster arm). None: the service's defaults for `pause_policy`
    (`bandmaster up`'s; the reference bands under threshold), in simulated seconds."""
    pause_policy: str = SERVICE_DEFAULT_PAUSE_POLICY
    """The scheduler service's default (services/scheduler/core/defaults.py), not the pure core's."""
    cost_aware: CostAwarePauseParams = field(default_factory=CostAwarePauseParams)
    """Parameters of the cost_aware pause policy (used when pause_policy is cost_aware)."""
    kv_router: KvRouterConfig = field(default_factory=KvRouterConfig)
    """The KvRouter settings the scheduler forwards to the router (temperature, overlap weight,
    output blocks, TTL); the live router applies the same values in both routed arms."""
    router_prompt: str = "text"
    """text: the live router's approximate text-chunk prompts; tokens: exact token pages (faster)."""
    live_speedup: float = 1.0
    """Model a live run at this simworker --speedup: the router's wall-clock constants (history
    TTL, request expiry, sweep) become this many times longer in simulated seconds."""
    frontend_latency: bool = True
    """Add the profile's frontend latency (HTTP, tokenization) before a request reaches the engine,
    as the live simworker does."""
    request_overhead_s: float = 0.0
    """Extra simulated seconds per turn between the client's send and the router's admission
    (client/router/scheduler round trips), for comparing with a live stack; 0 = none."""
    live_path: LivePathCosts | None = None
    """Model the live path's per-turn costs outside the engine (harness/simlib/live_path.py), in wall
    seconds converted by `live_speedup`; None = none (the offline figures)."""
    fuse_decode: bool = True
    """Advance stretches of pure decode steps as one event (SimEngine.plan_decode), cut at the
    first step boundary after an arrival. Exactly equivalent to one event per engine step
    (tested); False is the slow reference."""
    thunderagent: ThunderAgentParams = field(default_factory=ThunderAgentParams)
    """The thunderagent arm's parameters (simulated seconds; the live proxy runs the same at --speedup)."""
    continuum: ContinuumParams = field(default_factory=ContinuumParams)
    """The continuum arm's parameters."""
    max_simulated_s: float = 30 * 24 * 3600.0
    """Safety horizon: the run stops (and says so) if programs are still running at this time."""

    def __post_init__(self) -> None:
        require(self.arm in ARMS, "arm", self.arm, f"arm in {{{', '.join(ARMS)}}}")
        require(self.workload in WORKLOADS, "workload", self.workload, f"workload in {{{', '.join(WORKLOADS)}}}")
        require(self.split in SPLITS, "split", self.split, f"split in {{{', '.join(SPLITS)}}}")
        require(self.draw in DRAWS, "draw", self.draw, f"draw in {{{', '.join(DRAWS)}}}")
        require(self.programs >= 1, "programs", self.programs, "programs >= 1")
        require(self.parallel >= 0, "parallel", self.parallel, "parallel >= 0")
        require(self.max_turns is None or self.max_turns >= 1, "max_turns", self.max_turns, "max_turns >= 1")
        require(self.variant >= 0, "variant", self.variant, "variant >= 0")
        require(
            math.isfinite(self.token_scale) and self.token_scale > 0, "token_scale", self.token_scale, "token_scale > 0"
        )
        require(
            math.isfinite(self.tool_time_scale) and self.tool_time_scale >= 0,
            "tool_time_scale",
            self.tool_time_scale,
            "tool_time_scale >= 0",
        )
        require(1 <= self.workers <= 4096, "workers", self.workers, "1 <= workers <= 4096")
        require(
            self.worker_page_size >= 2,
            "worker_page_size",
            self.worker_page_size,
            "worker_page_size >= 2 (the KV router needs pages of more than one token)",
        )
        # The simworker server's rule (services/simworker/config.py); the engine alone would accept less.
        require(
            self.worker_chunked_prefill_size >= self.worker_page_size,
            "worker_chunked_prefill_size",
            self.worker_chunked_prefill_size,
            "worker_chunked_prefill_size >= worker_page_size",
        )
        require(
            self.worker_kv_tokens >= self.worker_page_size,
            "worker_kv_tokens",
            self.worker_kv_tokens,
            "worker_kv_tokens >= worker_page_size",
        )
        require(
            self.worker_host_kv_tokens == 0 or self.worker_host_kv_tokens > self.worker_kv_tokens,
            "worker_host_kv_tokens",
            self.worker_host_kv_tokens,
            "worker_host_kv_tokens == 0 or worker_host_kv_tokens > worker_kv_tokens (SGLang's host pool rule)",
        )
        if self.control is None:
            object.__setattr__(
                self,
                "control",
                service_control_params(
                    self.pause_policy if self.pause_policy in PAUSE_POLICIES else SERVICE_DEFAULT_PAUSE_POLICY
                ),
            )
        check_policy_settings(self.control, self.pause_policy, self.cost_aware)
        require(
            isinstance(self.kv_router, KvRouterConfig), "kv_router", self.kv_router, "kv_router is a KvRouterConfig"
        )
        require(
            self.router_prompt in ROUTER_PROMPT_MODES,
            "router_prompt",
            self.router_prompt,
            f"router_prompt in {{{', '.join(ROUTER_PROMPT_MODES)}}}",
        )
        require(
            math.isfinite(self.live_speedup) and self.live_speedup > 0,
            "live_speedup",
            self.live_speedup,
            "live_speedup > 0",
        )
        require(
            math.isfinite(self.request_overhead_s) and self.request_overhead_s >= 0,
            "request_overhead_s",
            self.request_overhead_s,
            "request_overhead_s >= 0",
        )
        require(
            self.live_path is None or isinstance(self.live_path, LivePathCosts),
            "live_path",
            self.live_path,
            "live_path is None or a LivePathCosts",
        )
        require(self.max_simulated_s > 0, "max_simulated_s", self.max_simulated_s, "max_simulated_s > 0")
        if self.arm == "oracle":
            # A pool-size-dependent decode cost would make the oracle's steps faster by itself.
            decode_x = load_profile(self.worker_timing_profile).decode_x
            require(
                decode_x == "context_k",
                "arm",
                self.arm,
                f"the oracle needs a timing profile whose decode cost depends on the decoding context "
                f"(decode_x context_k), not on the pool size; {self.worker_timing_profile} has {decode_x}",
            )
        if self.workload in ("swe", "synthetic"):
            split_source(self.trace, self.split)  # a bad trace file or an empty split fails here
        # Fail here, not mid-run: the engine and router configs validate their own rules.
        self.engine_config(0)
        self.router_params()
        self.make_pause_policy()

    def draw_seed(self, name: str) -> str:
        """The seed of one of the run's random sources (`variant` 0: the source `seed` has always seeded)."""
        return f"{name}{self.seed}" if self.variant == 0 else f"{name}{self.seed}/{self.variant}"

    # -- the programs ------------------------------------------------------------------------------

    def build_programs(self) -> list[Program]:
        """The run's programs, exactly as the live runner builds them (clients/player.py build_workload)."""
        return build_workload(
            self.workload,
            self.programs,
            seed=self.seed,
            max_turns=self.max_turns,
            token_scale=self.token_scale,
            tool_time_scale=self.tool_time_scale,
            trace=self.trace,
            split=self.split,
            draw=self.draw,
            include_longest=self.include_longest,
        )

    def oracle_worker_kv_tokens(self, programs: Sequence[Program]) -> int:
        """The oracle's GPU KV per worker: max(10 x worker_kv_tokens, what all of `programs` hold at
        once), so that nothing is ever evicted whichever worker the programs land on. A program
        holds its peak context, every answer it generated (dead branches: the next prompt carries a
        re-rendered copy) and 64 tokens per turn of template and page slack; plus the system
        prompt once. Decode cost depends on the summed context of the decoding requests, not on
        the pool (`decode_x` context_k, checked on construction), so the bigger pool does not make
        a step faster by itself: it only removes eviction and the recompute that follows."""
        held = SYSTEM_PROMPT_TOKENS + sum(
            p.peak_context_tokens + sum(t.output_tokens for t in p.turns) + ORACLE_SLACK_TOKENS_PER_TURN * len(p.turns)
            for p in programs
        )
        tokens = max(ORACLE_POOL_FACTOR * self.worker_kv_tokens, held)
        return -(-tokens // self.worker_page_size) * self.worker_page_size

    def engine_scenario(self, programs: Sequence[Program]) -> "SimScenario":
        """The scenario the workers are built from: this one, or for the oracle the same with its
        pool (`oracle_worker_kv_tokens`) and the host tier, if any, at the same host/GPU ratio."""
        if self.arm != "oracle":
            return self
        gpu = self.oracle_worker_kv_tokens(programs)
        host = round(self.worker_host_kv_tokens * gpu / self.worker_kv_tokens) if self.worker_host_kv_tokens else 0
        return replace(self, worker_kv_tokens=gpu, worker_host_kv_tokens=host)

    # -- the worker side, as `bandmaster up` builds it ------------------------------------------

    def engine_config(self, index: int) -> EngineConfig:
        """The engine config of worker `index`, as the simworker maps the flags that cluster.py
        `simworker_spec` gives it: seed = index, HiCache write_back with ratio = host / GPU printed to
        6 decimals (no --hicache-size), no KV-event publisher, priority scheduling on."""
        hierarchical = self.worker_host_kv_tokens > 0
        ratio = float(f"{self.worker_host_kv_tokens / self.worker_kv_tokens:.6f}") if hierarchical else 2.0
        return EngineConfig(
            max_total_tokens=self.worker_kv_tokens,
            page_size=self.worker_page_size,
            max_running_requests=self.worker_max_running_requests,
            chunked_prefill_size=self.worker_chunked_prefill_size,
            context_length=self.worker_context_length,
            enable_hierarchical_cache=hierarchical,
            hicache_ratio=ratio,
            hicache_write_policy="write_back" if hierarchical else "write_through",
            seed=index,
            emit_kv_events=False,
            enable_priority_scheduling=True,
        )

    def build_worker(self, index: int) -> tuple[Engine, TimingProfile, ReplicaCapacity]:
        """The engine of worker `index`, its timing profile and its capacity as the scheduler sees it.
        The engine gives out a request's outputs at its first token and its end only (the simulator
        reads nothing in between; the live simworker streams every step's tokens): the same run."""
        config = self.engine_config(index)
        profile = load_profile(self.worker_timing_profile)
        engine = build_engine(replace(config, stream_outputs=False), profile)
        return engine, profile, replica_capacity(worker_id(index), config, profile)

    # -- the control plane -----------------------------------------------------------------------

    def make_peer(self) -> PeerPolicy | None:
        """The peer arm's policy core over the workers' KV pools (None for the other arms)."""
        return make_peer(
            self.arm,
            [self.worker_kv_tokens] * self.workers,
            self.thunderagent,
            self.continuum,
            load_profile(self.worker_timing_profile),
            self.worker_chunked_prefill_size,
        )

    def make_pause_policy(self):
        """The policy the scheduler service builds (server.py: make_pause_policy(name, params))."""
        return make_pause_policy(self.pause_policy, self.cost_aware if self.pause_policy == "cost_aware" else None)

    def router_params(self) -> KvRouterParams:
        """What the live router resolves under `bandmaster up` (turns.py `resolve_params`): KV
        events off (chat prompts are text), block size = the workers' page size, the forwarded
        KvRouter settings otherwise. The history TTL counts wall seconds live (see live_speedup)."""
        kv = self.kv_router
        return KvRouterParams(
            router_temperature=kv.router_temperature,
            kv_overlap_score_weight=kv.kv_overlap_score_weight,
            use_kv_events=False,
            router_track_active_blocks=kv.router_track_active_blocks,
            router_track_output_blocks=kv.router_track_output_blocks,
            router_track_prefill_tokens=kv.router_track_prefill_tokens,
            block_size=self.worker_page_size,
            router_ttl_s=kv.router_ttl_secs * self.live_speedup,
            request_expiry_s=ROUTER_REQUEST_EXPIRY_WALL_S * self.live_speedup,
        )

    @property
    def router_sweep_interval_s(self) -> float:
        return ROUTER_SWEEP_WALL_S * self.live_speedup

    @property
    def sample_interval_s(self) -> float:
        """Timeline sampling period: the scheduler's tick (every arm samples at the same times)."""
        return self.control_law.scheduler_interval_seconds

    @property
    def control_law(self) -> ControlParams:
        """`control`, never None once constructed (__post_init__ fills in the service's defaults)."""
        assert self.control is not None
        return self.control


def live_control_params(
    speedup: float, pause_policy: str = SERVICE_DEFAULT_PAUSE_POLICY, **overrides: float
) -> ControlParams:
    """The control law `bandmaster up --speedup S` runs, in simulated seconds: cluster.py passes
    interval max(0.05, 5/S), tau 1/S, resume timeout 1800/S, idle TTL 900/S and resume aging 300/S wall seconds, which
    are S times longer in simulated time (so only the 0.05 s floor shows at high speedups)."""
    values = dict(
        scheduler_interval_seconds=max(SCHEDULER_MIN_INTERVAL_WALL_S, 5.0 / speedup) * speedup,
        acting_decay_tau_seconds=1.0,
        resume_timeout_seconds=1800.0,
        program_idle_ttl_seconds=900.0,
        resume_aging_seconds=300.0,
    )
    values.update(overrides)
    return service_control_params(pause_policy, **values)


def make_peer(
    arm: str,
    capacities: Sequence[int],
    thunderagent: ThunderAgentParams,
    continuum: ContinuumParams,
    profile: TimingProfile,
    chunked_prefill_size: int,
) -> PeerPolicy | None:
    """The policy core of peer arm `arm` (None for a non-peer arm); the live proxy builds it the same
    way. Continuum's reload cost is the timing profile's prefill of the context, chunk by chunk."""
    if arm == "thunderagent":
        return ThunderAgentCore(thunderagent, capacities)
    if arm == "continuum":
        return ContinuumCore(continuum, capacities, prefill_reload_s(profile.prefill_chunk_ms, chunked_prefill_size))
    return None


def worker_id(index: int) -> str:
    return f"worker-{index}"


def server_info(config: EngineConfig, profile: TimingProfile) -> dict:
    """The fields of the simworker's /server_info that the capacity service reads
    (services/simworker/http_api.py `server_info`) for a worker started with `config`'s sizes and
    the default model path, no --hicache-size and no storage backend (SimScenario.engine_config)."""
    info = {
        "served_model_name": DEFAULT_MODEL_PATH,
        "model_path": DEFAULT_MODEL_PATH,
        "page_size": config.page_size,
        "dp_size": 1,
        "max_running_requests": config.max_running_requests,
        "max_total_num_tokens": config.max_total_tokens,
        "context_length": config.context_length,
        "enable_hierarchical_cache": config.enable_hierarchical_cache,
        "hicache_ratio": config.hicache_ratio,
        "hicache_size": 0.0,
        "hicache_write_policy": config.hicache_write_policy,
        "hicache_storage_backend": None,
        "kv_bytes_per_token": profile.kv_bytes_per_token,
    }
    if config.enable_hierarchical_cache:
        info["hicache_host_total_tokens"] = host_total_tokens(config)
    return info


def replica_capacity(worker: str, config: EngineConfig, profile: TimingProfile) -> ReplicaCapacity:
    """The capacity service's retention budget for this worker (GPU KV + counted host tokens)
    and its request slots, as the scheduler receives them."""
    card = derive_card(server_info(config, profile))
    if isinstance(card, CardRejection):
        raise ValueError(f"the capacity service would reject worker {worker}: {card}")
    (replica,) = replicas_for(worker, card, RetentionSettings())
    return ReplicaCapacity(worker, replica.dp_rank, replica.retention_tokens, replica.max_programs)
