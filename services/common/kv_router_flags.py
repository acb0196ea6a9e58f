"""The KvRouter flags (reference/kvrouter_sglang.md §A.9), declared once for the scheduler and the router.

The scheduler accepts every one with its real default, validates it and forwards it to routers in
`GetRouterConfig`. The router accepts some of them as overrides: their flags default to None, "not
given", meaning take the scheduler's value (the help says so).

    scheduler_settings()                   # Settings with the real defaults
    router_settings("router_temperature")  # Settings defaulting to None, help noting the scheduler's value
    validate(values)                       # ConfigError(name, value, "name >= 0") for a value off its rule
    refuse_unsupported(argv, env)          # ConfigError for a Dynamo KvRouter flag Bandmaster does not implement
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from services.common.config import Setting, require
from services.common.errors import ConfigError

_OPS: dict[str, Callable[[Any, Any], bool]] = {">=": operator.ge, ">": operator.gt}


@dataclass(frozen=True)
class KvRouterFlag:
    """One KvRouter setting. `rule` is "OP BOUND" (">= 0", "> 0")."""

    name: str
    type: type
    default: Any
    help: str
    env: str
    rule: str = ""

    def check(self, value: Any) -> None:
        """Raise ConfigError naming the rule unless `value` keeps it."""
        if self.rule:
            op, bound = self.rule.split()
            require(_OPS[op](value, self.type(bound)), self.name, value, f"{self.name} {self.rule}")


FROM_SCHEDULER = " (default: the scheduler's value)"

KV_ROUTER_FLAGS = (
    KvRouterFlag(
        "router_temperature",
        float,
        0.0,
        "softmax temperature of worker selection (0 = argmin)",
        "DYN_ROUTER_TEMPERATURE",
        ">= 0",
    ),
    KvRouterFlag(
        "kv_overlap_score_weight",
        float,
        1.0,
        "weight of the prefill (uncached tokens) term",
        "DYN_KV_OVERLAP_SCORE_WEIGHT",
        ">= 0",
    ),
    KvRouterFlag(
        "use_kv_events",
        bool,
        True,
        "index KV events from workers (else approximate by routing history + TTL)",
        "DYN_USE_KV_EVENTS",
    ),
    KvRouterFlag(
        "router_track_active_blocks",
        bool,
        True,
        "count the active requests' prompt blocks in each worker's decode load (off: a worker's decode "
        "term is only the new prompt's blocks, so load does not steer the pick)",
        "DYN_ROUTER_TRACK_ACTIVE_BLOCKS",
    ),
    KvRouterFlag(
        "router_track_output_blocks",
        bool,
        False,
        "add output blocks with OSL decay to the load",
        "DYN_ROUTER_TRACK_OUTPUT_BLOCKS",
    ),
    KvRouterFlag(
        "router_track_prefill_tokens",
        bool,
        True,
        "count the uncached prompt tokens of requests still in prefill in each worker's prefill load "
        "(off: only the new prompt's own uncached tokens)",
        "DYN_ROUTER_TRACK_PREFILL_TOKENS",
    ),
    KvRouterFlag(
        "router_ttl_secs", float, 120.0, "TTL of approximate (no-events) index entries", "DYN_ROUTER_TTL_SECS", "> 0"
    ),
    KvRouterFlag(
        "router_block_size",
        int,
        128,
        "KV block size (tokens) of the router's prefix index",
        "DYN_ROUTER_BLOCK_SIZE",
        "> 0",
    ),
)
BY_NAME = {flag.name: flag for flag in KV_ROUTER_FLAGS}

# Dynamo KvRouter settings Bandmaster does not implement: refused by name (flag or environment variable),
# never accepted and ignored. Name -> why.
UNSUPPORTED = {
    "router_replica_sync": "one router's load is not shared with other router replicas (docs/router.md)",
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
    return [Setting(f.name, f.type, f.default, f.help, env=f.env) for f in KV_ROUTER_FLAGS]


def router_settings(*names: str) -> list[Setting]:
    """The flags `names`, in that order, defaulting to None: not given, the scheduler's value is used."""
    return [
        Setting(f.name, f.type, None, f.help + FROM_SCHEDULER, env=f.env) for f in (BY_NAME[name] for name in names)
    ]


def validate(values: Mapping[str, Any]) -> None:
    """Check each KvRouter value in `values` against its rule; None (not given) passes."""
    for name, value in values.items():
        if value is not None:
            BY_NAME[name].check(value)
