"""The KvRouter flags (reference/kvrouter_sglang.md §A.9), declared once for the scheduler and the router.

The scheduler accepts every one with its real default, validates it and forwards it to routers in
`GetRouterConfig`. The router accepts some of them as overrides: their flags default to None, "not
given", meaning take the scheduler's value (the help says so).

    scheduler_settings()                   # Settings with the real defaults
    router_settings("router_temperature")  # Settings defaulting to None, help noting the scheduler's value
    validate(values)                       # ConfigError(name, value, "name >= 0") for a value off its rule
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from services.common.config import Setting, require

_OPS: dict[str, Callable[[Any, Any], bool]] = {">=": operator.ge, ">": operator.gt}


@dataclass(frozen=True)
class KvRouterFlag:
    """One KvRouter setting. `rule` is "OP BOUND" (">= 0", "> 0"); `choices` bound a string."""

    name: str
    type: type
    default: Any
    help: str
    env: str
    rule: str = ""
    choices: tuple[str, ...] | None = None

    def check(self, value: Any) -> None:
        """Raise ConfigError naming the rule unless `value` keeps it."""
        if self.choices is not None:
            require(value in self.choices, self.name, value, f"{self.name} in {{{', '.join(self.choices)}}}")
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
        "router_replica_sync",
        bool,
        False,
        "share active-request state between router replicas",
        "DYN_ROUTER_REPLICA_SYNC",
    ),
    KvRouterFlag(
        "router_track_active_blocks",
        bool,
        True,
        "maintain decode-block load per worker",
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
        "router_assume_kv_reuse", bool, True, "deduplicate active blocks by their hashes", "DYN_ROUTER_ASSUME_KV_REUSE"
    ),
    KvRouterFlag(
        "router_track_prefill_tokens",
        bool,
        True,
        "include prompt tokens in the prefill load",
        "DYN_ROUTER_TRACK_PREFILL_TOKENS",
    ),
    KvRouterFlag(
        "router_snapshot_threshold",
        int,
        1_000_000,
        "events between index snapshots",
        "DYN_ROUTER_SNAPSHOT_THRESHOLD",
        "> 0",
    ),
    KvRouterFlag("router_reset_states", bool, False, "purge router state on start", "DYN_ROUTER_RESET_STATES"),
    KvRouterFlag(
        "router_ttl_secs", float, 120.0, "TTL of approximate (no-events) index entries", "DYN_ROUTER_TTL_SECS", "> 0"
    ),
    KvRouterFlag("router_event_threads", int, 4, "KV event indexer threads", "DYN_ROUTER_EVENT_THREADS", ">= 1"),
    KvRouterFlag(
        "router_queue_threshold",
        float,
        0.0,
        "hold requests while every worker's prefill load exceeds this multiple of its batch budget (0 = off)",
        "DYN_ROUTER_QUEUE_THRESHOLD",
        ">= 0",
    ),
    KvRouterFlag(
        "router_queue_policy",
        str,
        "fcfs",
        "router queue order",
        "DYN_ROUTER_QUEUE_POLICY",
        choices=("fcfs", "lcfs", "wspt"),
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


def scheduler_settings() -> list[Setting]:
    """Every KvRouter flag with its real default."""
    return [Setting(f.name, f.type, f.default, f.help, env=f.env, choices=f.choices) for f in KV_ROUTER_FLAGS]


def router_settings(*names: str) -> list[Setting]:
    """The flags `names`, in that order, defaulting to None: not given, the scheduler's value is used."""
    return [
        Setting(f.name, f.type, None, f.help + FROM_SCHEDULER, env=f.env, choices=f.choices)
        for f in (BY_NAME[name] for name in names)
    ]


def validate(values: Mapping[str, Any]) -> None:
    """Check each KvRouter value in `values` against its rule; None (not given) passes."""
    for name, value in values.items():
        if value is not None:
            BY_NAME[name].check(value)
