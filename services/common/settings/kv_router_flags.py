"""The KvRouter flags (reference/kvrouter_sglang.md §A.9), declared once for the scheduler and the router.

The scheduler accepts every one with its real default, validates it and forwards it to routers in
`GetRouterConfig`. The router accepts some of them as overrides: their flags default to None, "not
given", meaning take the scheduler's value (the help says so).

    KvRouterFlags                          # the declaration: setting() fields with real defaults and rules
    scheduler_settings()                   # its Settings
    override("router_temperature")         # a router field: the same flag defaulting to None
    validate(values)                       # ConfigError(name, value, "name >= 0") for a value off its rule
    refuse_unsupported(argv, env)          # ConfigError for a Dynamo KvRouter flag Bandmaster does not implement
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from services.common.settings.config import Setting, check_values, setting, setting_like, settings_of
from services.common.settings.errors import ConfigError


@dataclass(frozen=True)
class KvRouterFlags:
    """Every KvRouter setting with its real default and rule (the scheduler's `KvRouterConfig` checks them)."""

    router_temperature: float = setting(
        0.0, "softmax temperature of worker selection (0 = argmin)", env="DYN_ROUTER_TEMPERATURE", ge=0
    )
    kv_overlap_score_weight: float = setting(
        1.0, "weight of the prefill (uncached tokens) term", env="DYN_KV_OVERLAP_SCORE_WEIGHT", ge=0
    )
    use_kv_events: bool = setting(
        True, "index KV events from workers (else approximate by routing history + TTL)", env="DYN_USE_KV_EVENTS"
    )
    router_track_active_blocks: bool = setting(
        True,
        "count the active requests' prompt blocks in each worker's decode load (off: a worker's decode "
        "term is only the new prompt's blocks, so load does not steer the pick)",
        env="DYN_ROUTER_TRACK_ACTIVE_BLOCKS",
    )
    router_track_output_blocks: bool = setting(
        False, "add output blocks with OSL decay to the load", env="DYN_ROUTER_TRACK_OUTPUT_BLOCKS"
    )
    router_track_prefill_tokens: bool = setting(
        True,
        "count the uncached prompt tokens of requests still in prefill in each worker's prefill load "
        "(off: only the new prompt's own uncached tokens)",
        env="DYN_ROUTER_TRACK_PREFILL_TOKENS",
    )
    router_ttl_secs: float = setting(
        120.0, "TTL of approximate (no-events) index entries", env="DYN_ROUTER_TTL_SECS", gt=0
    )
    router_block_size: int = setting(
        128, "KV block size (tokens) of the router's prefix index", env="DYN_ROUTER_BLOCK_SIZE", gt=0
    )


FROM_SCHEDULER = " (default: the scheduler's value)"

KV_ROUTER_FLAGS: tuple[Setting, ...] = tuple(settings_of(KvRouterFlags))
BY_NAME = {flag.name: flag for flag in KV_ROUTER_FLAGS}


def override(name: str) -> Any:
    """The router's field for KvRouter flag `name`: same flag, env and rule, defaulting to None (not given:
    the scheduler's value is used, as its help says)."""
    return setting_like(KvRouterFlags, name, default=None, help_suffix=FROM_SCHEDULER)


# Dynamo KvRouter settings Bandmaster does not implement: refused by name (flag or environment variable),
# never accepted and ignored. Name -> why.
UNSUPPORTED = {
    "router_assume_kv_reuse": "active blocks are always deduplicated by their hashes",
    "router_snapshot_threshold": "the router's prefix index is in memory only, never snapshotted",
    "router_reset_states": "the router's state is in memory only, so every start is already a reset",
    "router_event_threads": "KV events are indexed on the router's event loop, not by a thread pool",
    "router_queue_threshold": "the router does not queue; the scheduler's admission holds turns",
    "router_queue_policy": "the router does not queue; the scheduler's admission holds turns",
}


def refuse_unsupported(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """Raise ConfigError naming a Dynamo KvRouter flag (`--name`, `--no-name`, `--name=V`) or its
    environment variable (`DYN_NAME`) that Bandmaster does not support."""
    for name, why in UNSUPPORTED.items():
        flag = "--" + name.replace("_", "-")
        for arg in argv:
            if arg.split("=", 1)[0] in (flag, "--no-" + flag[2:]):
                raise ConfigError(name, arg, f"{flag} is a Dynamo KvRouter flag not supported by Bandmaster: {why}")
        variable = "DYN_" + name.upper()
        if env.get(variable, "").strip():
            raise ConfigError(
                name, env[variable], f"{variable} is a Dynamo KvRouter setting not supported by Bandmaster: {why}"
            )


def scheduler_settings() -> list[Setting]:
    """Every KvRouter flag with its real default."""
    return list(KV_ROUTER_FLAGS)


def validate(values: Mapping[str, Any]) -> None:
    """Check each KvRouter value in `values` against its declared rule; None (not given) passes."""
    check_values(KvRouterFlags, values)
