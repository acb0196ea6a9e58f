"""Scheduler configuration: every flag, environment variable and default of the seed reference.

`load_config(argv, env)` is the one mapping from flags and environment to a validated, frozen
`SchedulerConfig`; an invalid value or relation raises `ConfigError` naming the violated rule.
Each setting is declared once: a `setting()` field of `SchedulerConfig`, or of the flags dataclass
of one of its core parameter groups (`ControlFlags`, `LeaseFlags`, `CostAwareFlags`, and
`KvRouterFlags` shared with the router).
The control-law relations live in `core.params.ControlParams.__post_init__`, which
`SchedulerConfig` runs on construction, so the core cannot be built with a config the service
would refuse. The control defaults and `KvRouterConfig` are the pure `core.defaults`, which the
offline simulator (harness/simlib) runs too.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields
from typing import Any, Mapping, Sequence

from services.common.auth.redact import redact_url
from services.common.auth.security import SecurityConfig, security_group
from services.common.observe.trace_export import TraceExport, trace_export_group
from services.common.settings import kv_router_flags
from services.common.settings.config import (
    Serve,
    Setting,
    check_bounds,
    group,
    load_groups,
    parse_host_port,
    parse_settings,
    require,
    setting,
    settings_of,
)
from services.common.settings.errors import ConfigError
from services.scheduler.core.defaults import (
    CONTROL_DEFAULTS,
    PROGRAM_AWARE_GROWTH_MARGIN,
    PROGRAM_AWARE_PAUSE_MARGIN_QUANTILE,
    PROGRAM_AWARE_PAUSE_THRESHOLD,
    PROGRAM_AWARE_RESUME_HYSTERESIS,
    PROGRAM_AWARE_RESUME_WAIT_DISCOUNT_SECONDS,
    PROGRAM_AWARE_TAIL_QUANTILE,
    REFERENCE_BANDS,
    SERVICE_DEFAULT_PAUSE_POLICY,
    KvRouterConfig,
    check_policy_settings,
    policy_control_defaults,
)
from services.scheduler.core.leadership import LeaseParams
from services.scheduler.core.params import ControlParams
from services.scheduler.core.policies import PAUSE_POLICIES, CostAwarePauseParams

ENV_PREFIX = "BANDMASTER_SCHEDULER"
TA = "DYN_THUNDERAGENT_"

# Band settings whose default depends on --pause-policy (core/defaults.py policy_control_defaults): the
# reference's values under `threshold`, the program-aware law's under every other policy. A flag or
# environment variable always wins. The other defaults are core/defaults.py CONTROL_DEFAULTS.
_POLICY_DEFAULTED = "(default: %s with --pause-policy threshold, %s otherwise)"
_BELOW_THRESHOLD = f"pause-threshold - {PROGRAM_AWARE_GROWTH_MARGIN}"
_D = CONTROL_DEFAULTS


@dataclass(frozen=True)
class ControlFlags:
    """The control law's flags, ControlParams' fields: None = the --pause-policy default. ControlParams checks
    the values and their relations."""

    pause_threshold: float | None = setting(
        None,
        "working-set fraction of the retention budget (GPU KV + HiCache host tokens) that starts a pause cycle "
        + _POLICY_DEFAULTED % (REFERENCE_BANDS["pause_threshold"], PROGRAM_AWARE_PAUSE_THRESHOLD),
        env=TA + "PAUSE_THRESHOLD",
    )
    soft_demote_threshold: float | None = setting(
        None,
        "start of the soft-demote band below the pause threshold "
        + _POLICY_DEFAULTED % (REFERENCE_BANDS["soft_demote_threshold"], _BELOW_THRESHOLD),
        env=TA + "SOFT_DEMOTE_THRESHOLD",
    )
    pause_target: float | None = setting(
        None,
        "setpoint that a pause cycle drives utilisation toward "
        + _POLICY_DEFAULTED % (REFERENCE_BANDS["pause_target"], _BELOW_THRESHOLD),
        env=TA + "PAUSE_TARGET",
    )
    resume_hysteresis: float | None = setting(
        None,
        "headroom below pause-threshold required before resume (absolute) "
        + _POLICY_DEFAULTED % (REFERENCE_BANDS["resume_hysteresis"], PROGRAM_AWARE_RESUME_HYSTERESIS),
        env=TA + "RESUME_HYSTERESIS",
    )
    resume_priority_boost: float = setting(
        _D["resume_priority_boost"],
        "transient priority seconds added to a resumed request",
        env=TA + "RESUME_PRIORITY_BOOST",
    )
    resume_timeout_seconds: float = setting(
        _D["resume_timeout_seconds"],
        "forced-resume cap that bounds starvation",
        env=TA + "RESUME_TIMEOUT_SECONDS",
    )
    scheduler_interval_seconds: float = setting(
        _D["scheduler_interval_seconds"],
        "scheduler tick period",
        env=TA + "SCHEDULER_INTERVAL_SECONDS",
    )
    soft_demote_priority_jump: float = setting(
        _D["soft_demote_priority_jump"],
        "priority seconds applied to soft-demoted programs",
        env=TA + "SOFT_DEMOTE_PRIORITY_JUMP",
    )
    acting_token_weight: float = setting(
        _D["acting_token_weight"],
        "multiplier on token_total for acting programs in the pause-side working set",
        env=TA + "ACTING_TOKEN_WEIGHT",
    )
    acting_decay_tau_seconds: float = setting(
        _D["acting_decay_tau_seconds"],
        "exponential-decay time constant for acting tokens in the resume-side working set",
        env=TA + "ACTING_DECAY_TAU_SECONDS",
    )
    program_idle_ttl_seconds: float = setting(
        _D["program_idle_ttl_seconds"],
        "release a program idle at a tool boundary this long (0 disables)",
        env=TA + "PROGRAM_IDLE_TTL_SECONDS",
    )
    # Ours, not the seed's: bounds how long shortest-first resume can pass over a large program
    # (the seed relies on --resume-timeout-seconds alone). 0 restores the reference behaviour.
    soft_pinning: bool = setting(
        _D["soft_pinning"],
        "while no replica is under pressure, let the router's KV cost pick the worker and follow it "
        "(--no-soft-pinning: always pin, as the reference)",
        env=f"{ENV_PREFIX}_SOFT_PINNING",
    )
    resume_aging_seconds: float = setting(
        _D["resume_aging_seconds"],
        "a held admission that waited this long pauses ACTING programs (shortest first) to make room for "
        "itself (0 disables)",
        env=f"{ENV_PREFIX}_RESUME_AGING_SECONDS",
    )
    tail_protection_quantile: float | None = setting(
        None,
        "a program that has run more turns than this quantile of released programs' turn counts is never "
        "paused for pressure and resumes first (0 disables) "
        + _POLICY_DEFAULTED
        % (REFERENCE_BANDS["tail_protection_quantile"], PROGRAM_AWARE_TAIL_QUANTILE),
        env=f"{ENV_PREFIX}_TAIL_PROTECTION_QUANTILE",
    )
    calibrate_token_estimates: bool | None = setting(
        None,
        "charge a reasoning program the router's prompt estimate scaled by the learnt ratio of the prompt "
        "tokens workers report to the estimates, so that the bands measure what the engines hold "
        + _POLICY_DEFAULTED
        % (REFERENCE_BANDS["calibrate_token_estimates"], "true"),
        env=f"{ENV_PREFIX}_CALIBRATE_TOKEN_ESTIMATES",
    )
    resume_wait_discount_seconds: float | None = setting(
        None,
        "resume paused programs smallest effective size first, a program of T tokens that waited w seconds "
        "counting T / (1 + w / this) (0: smallest T first) "
        + _POLICY_DEFAULTED
        % (REFERENCE_BANDS["resume_wait_discount_seconds"], PROGRAM_AWARE_RESUME_WAIT_DISCOUNT_SECONDS),
        env=f"{ENV_PREFIX}_RESUME_WAIT_DISCOUNT_SECONDS",
    )
    pause_margin_quantile: float | None = setting(
        None,
        "a pause cycle stops this quantile of the working-set growth measured between ticks below the pause "
        "threshold, never below pause-target (0: always at pause-target) "
        + _POLICY_DEFAULTED
        % (REFERENCE_BANDS["pause_margin_quantile"], PROGRAM_AWARE_PAUSE_MARGIN_QUANTILE),
        env=f"{ENV_PREFIX}_PAUSE_MARGIN_QUANTILE",
    )


@dataclass(frozen=True)
class LeaseFlags:
    """The leadership lease's flags (LeaseParams ttl_s, renew_s, poll_s, margin_s, which checks them)."""

    leader_lease_seconds: float = setting(
        LeaseParams.ttl_s,
        "the leadership lease lasts this long after each renewal (a crashed leader is replaced after it)",
        env=f"{ENV_PREFIX}_LEADER_LEASE_SECONDS",
    )
    leader_renew_seconds: float = setting(
        LeaseParams.renew_s,
        "the leader renews its lease this often",
        env=f"{ENV_PREFIX}_LEADER_RENEW_SECONDS",
    )
    leader_poll_seconds: float = setting(
        LeaseParams.poll_s,
        "a standby tries to take the lease this often",
        env=f"{ENV_PREFIX}_LEADER_POLL_SECONDS",
    )
    leader_margin_seconds: float = setting(
        LeaseParams.margin_s,
        "a leader that could not renew steps down this long before its lease can expire in the store",
        env=f"{ENV_PREFIX}_LEADER_MARGIN_SECONDS",
    )


# Parameters of `--pause-policy cost_aware` (core/policies/cost_aware.py); ignored by other policies.
_CA = f"{ENV_PREFIX}_COST_AWARE_"


@dataclass(frozen=True)
class CostAwareFlags:
    """CostAwarePauseParams' fields behind a cost_aware_ prefix (it checks them)."""

    cost_aware_prefill_tokens_per_s: float = setting(
        CostAwarePauseParams.prefill_tokens_per_s,
        "cost_aware: prior prefill rate (tokens/s) until time-to-first-token observations arrive",
        env=_CA + "PREFILL_TOKENS_PER_S",
    )
    cost_aware_prefill_quadratic_tokens: float = setting(
        CostAwarePauseParams.prefill_quadratic_tokens,
        "cost_aware: context length at which attention doubles the linear prefill cost",
        env=_CA + "PREFILL_QUADRATIC_TOKENS",
    )
    cost_aware_tool_seconds: float = setting(
        CostAwarePauseParams.tool_seconds,
        "cost_aware: prior mean tool time (s) until tool times are observed",
        env=_CA + "TOOL_SECONDS",
    )
    cost_aware_stall_share: float = setting(
        CostAwarePauseParams.stall_share,
        "cost_aware: share of the replica budget counted as stalled while a context is recomputed (0..1)",
        env=_CA + "STALL_SHARE",
    )
    cost_aware_prior_observations: float = setting(
        CostAwarePauseParams.prior_observations,
        "cost_aware: weight of the priors, in observations",
        env=_CA + "PRIOR_OBSERVATIONS",
    )
    cost_aware_half_life_observations: float = setting(
        CostAwarePauseParams.half_life_observations,
        "cost_aware: observations after which an observation counts half",
        env=_CA + "HALF_LIFE_OBSERVATIONS",
    )
    cost_aware_min_hold_fraction: float = setting(
        CostAwarePauseParams.min_hold_fraction,
        "cost_aware: contexts whose hold fraction is below this are let go entirely (0..1; 1 = binary rule)",
        env=_CA + "MIN_HOLD_FRACTION",
    )
    cost_aware_scale_reasoning: bool = setting(
        CostAwarePauseParams.scale_reasoning,
        "cost_aware: weigh reasoning programs by their hold fraction too",
        env=_CA + "SCALE_REASONING",
    )


MEMORY_STATE = ("", "none")
_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def default_state_path(env: Mapping[str, str]) -> str:
    """$XDG_STATE_HOME/bandmaster/scheduler.sqlite, else $HOME/.local/state/bandmaster/scheduler.sqlite,
    else ./bandmaster-state/scheduler.sqlite (a function of `env` only)."""
    if env.get("XDG_STATE_HOME", "").strip():
        return os.path.join(env["XDG_STATE_HOME"], "bandmaster", "scheduler.sqlite")
    if env.get("HOME", "").strip():
        return os.path.join(env["HOME"], ".local", "state", "bandmaster", "scheduler.sqlite")
    return os.path.join("bandmaster-state", "scheduler.sqlite")


@dataclass(frozen=True)
class SchedulerConfig:
    """The scheduler service's whole configuration, validated on construction.

    Each `setting()` field is a flag and an environment variable; each `group()` lists the flags of a
    core parameter set (ControlFlags -> ControlParams, ...) in its place. Declared once, here."""

    control: ControlParams = group(default_factory=ControlParams, flags=ControlFlags)
    """The control law; its __post_init__ enforces every relation of the seed reference."""
    pause_policy: str = setting(
        SERVICE_DEFAULT_PAUSE_POLICY,
        "pause policy: threshold (the reference) or cost_aware",
        env=f"{ENV_PREFIX}_PAUSE_POLICY",
        choices=tuple(sorted(PAUSE_POLICIES)),
    )
    capacity_addr: str = setting(
        "127.0.0.1:50051",
        "capacity service gRPC address host:port",
        env=f"{ENV_PREFIX}_CAPACITY_ADDR",
    )
    ticket_lease_seconds: float = setting(
        30.0,
        "an admitted turn whose router does not renew it (RenewLeases) within this many seconds is ended as "
        "if Complete(CANCELLED) had arrived, so a router crash cannot leave programs REASONING (0 = never)",
        env=f"{ENV_PREFIX}_TICKET_LEASE_SECONDS",
        ge=0,
        lt=math.inf,
    )
    """Lease of an admitted turn, renewed by its router; 0 = turns end only by Complete."""
    state_path: str | None = setting(
        None,
        "SQLite file the program table is kept in and recovered from at start; empty or 'none' = in memory "
        "only (default: $XDG_STATE_HOME/bandmaster/scheduler.sqlite, else ~/.local/state/bandmaster/...)",
        env=f"{ENV_PREFIX}_STATE_PATH",
    )
    """SQLite file of the durable state; None, "" or "none" = in memory (`load_config` resolves None to
    `default_state_path(env)`)."""
    state_redis_url: str = setting(
        "",
        "keep the table in Redis instead (redis://[user:password@]host:port/db, rediss://, unix://); "
        "--state-path is then not used",
        env=f"{ENV_PREFIX}_STATE_REDIS_URL",
    )
    """Redis instead of SQLite when set."""
    state_redis_prefix: str = setting(
        "bandmaster:scheduler:",
        "prefix of the scheduler's Redis keys",
        env=f"{ENV_PREFIX}_STATE_REDIS_PREFIX",
    )
    state_flush_seconds: float = setting(
        1.0,
        "changes are written in one batch this often (the most a crash can lose)",
        env=f"{ENV_PREFIX}_STATE_FLUSH_SECONDS",
        gt=0,
        lt=math.inf,
    )
    state_write_timeout_seconds: float = setting(
        2.0,
        "bound on one state write (and on each Redis command); a slower store counts as failing",
        env=f"{ENV_PREFIX}_STATE_WRITE_TIMEOUT_SECONDS",
        gt=0,
        lt=math.inf,
    )
    state_load_timeout_seconds: float = setting(
        30.0,
        "how long the start waits for the state store to answer before refusing to start",
        env=f"{ENV_PREFIX}_STATE_LOAD_TIMEOUT_SECONDS",
        gt=0,
        lt=math.inf,
    )
    leader_election: bool = setting(
        False,
        "run as one of several scheduler replicas sharing the state store: the replica holding the "
        "store's leadership lease decides, the others stand by and answer FAILED_PRECONDITION with the "
        "leader's address (needs --state-path or --state-redis-url)",
        env=f"{ENV_PREFIX}_LEADER_ELECTION",
    )
    """Active/standby: decide only while holding the store's leadership lease."""
    advertise_addr: str = setting(
        "",
        "the host:port other processes reach this replica at, published with the lease so that standbys "
        "redirect to it (default: the bound --listen address; set it when listening on 0.0.0.0)",
        env=f"{ENV_PREFIX}_ADVERTISE_ADDR",
    )
    """Where others reach this replica ("" = the bound listen address)."""
    lease: LeaseParams = group(default_factory=LeaseParams, flags=LeaseFlags)
    """Timing of the leadership lease (validated even without leader election)."""
    cost_aware: CostAwarePauseParams = group(default_factory=CostAwarePauseParams, flags=CostAwareFlags)
    """Parameters of the cost_aware pause policy (validated even when another policy is chosen)."""
    # KvRouter flags (kvrouter_sglang.md §A.9): accepted, validated and forwarded to the router.
    kv_router: KvRouterConfig = group(default_factory=KvRouterConfig, flags=kv_router_flags.KvRouterFlags)
    listen: str = Serve.listen(ENV_PREFIX, "127.0.0.1:50052")
    metrics_port: int = Serve.metrics_port(ENV_PREFIX, 9102)
    log_level: str = Serve.log_level(ENV_PREFIX)
    shutdown_grace_seconds: float = Serve.shutdown_grace_seconds(ENV_PREFIX)
    ready_file: str = Serve.ready_file(ENV_PREFIX)
    trace_sample_ratio: float | None = Serve.trace_sample_ratio(ENV_PREFIX)
    """Root sampling ratio of traces (parent-based); None = OTEL_TRACES_SAMPLER(_ARG), default all."""
    security: SecurityConfig = security_group(ENV_PREFIX)
    """TLS, tokens, reflection (services/common/auth/security.py)."""
    tracing: TraceExport = trace_export_group(ENV_PREFIX)
    """Span file and console lines, turn spans only or all (`--trace-*`, services/common/observe/trace_export.py)."""

    def __post_init__(self) -> None:
        check_bounds(self)
        parse_host_port(self.listen, "listen")
        check_policy_settings(self.control, self.pause_policy, self.cost_aware)
        parse_host_port(self.capacity_addr, "capacity_addr")
        if self.state_redis_url:
            require(
                self.state_redis_url.startswith(_REDIS_SCHEMES),
                "state_redis_url",
                redact_url(self.state_redis_url),
                "state_redis_url starts with redis://, rediss:// or unix://",
            )
        prefix = self.state_redis_prefix
        require(
            0 < len(prefix) <= 128 and prefix.isascii() and prefix.isprintable() and " " not in prefix,
            "state_redis_prefix",
            prefix,
            "state_redis_prefix is 1-128 printable ASCII characters, no spaces",
        )
        require(
            not (self.leader_election and self.state_store == "memory"),
            "leader_election",
            True,
            "leader election needs a state store the replicas share (--state-path FILE or --state-redis-url), "
            "not the in-memory table",
        )
        if self.advertise_addr:
            parse_host_port(self.advertise_addr, "advertise_addr")

    @property
    def state_store(self) -> str:
        """Where the durable state lives: "redis", "sqlite" or "memory"."""
        if self.state_redis_url:
            return "redis"
        return "memory" if (self.state_path or "").strip().lower() in MEMORY_STATE else "sqlite"

    def pause_policy_params(self) -> Any:
        """The params for `make_pause_policy(self.pause_policy, ...)` (None: the policy's defaults)."""
        return self.cost_aware if self.pause_policy == "cost_aware" else None


SETTINGS: list[Setting] = settings_of(SchedulerConfig)
"""The flags and environment variables: SchedulerConfig's fields and groups, then the composed sub-configs'."""
CONTROL_SETTINGS = settings_of(ControlFlags)
COST_AWARE_SETTINGS = settings_of(CostAwareFlags)
_GROUPS = {
    name: [f.name for f in fields(flags)]
    for name, flags in (
        ("control", ControlFlags),
        ("lease", LeaseFlags),
        ("cost_aware", CostAwareFlags),
        ("kv_router", kv_router_flags.KvRouterFlags),
    )
}
_LEASE = {
    "leader_lease_seconds": "ttl_s",
    "leader_renew_seconds": "renew_s",
    "leader_poll_seconds": "poll_s",
    "leader_margin_seconds": "margin_s",
}


def load_config(argv: Sequence[str], env: Mapping[str, str]) -> SchedulerConfig:
    """Flags win over environment, environment over defaults; raises ConfigError."""
    kv_router_flags.refuse_unsupported(argv, env)
    values = parse_settings(
        SETTINGS,
        argv,
        env,
        prog="bandmaster-scheduler",
        description="Bandmaster scheduler: program table, control bands, admission",
    )
    load_groups(SchedulerConfig, values, env)  # security, span export
    groups = {name: {n: values.pop(n) for n in names} for name, names in _GROUPS.items()}
    control_values = groups["control"]
    for name, default in policy_control_defaults(values["pause_policy"], control_values["pause_threshold"]).items():
        if control_values[name] is None:
            control_values[name] = default
    prefix = len("cost_aware_")
    try:
        cost_aware = CostAwarePauseParams(**{n[prefix:]: v for n, v in groups["cost_aware"].items()})
    except ConfigError as exc:  # name the flag's setting, not the dataclass field
        raise ConfigError("cost_aware_" + exc.field, exc.value, exc.reason) from None
    if values["state_path"] is None:
        values["state_path"] = default_state_path(env)
    return SchedulerConfig(
        control=ControlParams(**control_values),
        cost_aware=cost_aware,
        lease=LeaseParams(**{_LEASE[n]: v for n, v in groups["lease"].items()}),
        kv_router=KvRouterConfig(**groups["kv_router"]),
        **values,
    )


__all__ = ["COST_AWARE_SETTINGS", "ConfigError", "SETTINGS", "SchedulerConfig", "load_config"]
