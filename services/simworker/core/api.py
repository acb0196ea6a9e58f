"""The contract between the simulated engine core and whoever drives it.

Two drivers step the same engine: the live HTTP server (`services/simworker/server.py`, wall
clock divided by `--speedup`) and the offline simulator (`bench/sim.py`, virtual time). Both do:

    engine.submit(request, now)           # any time
    result = engine.step(now)             # one scheduler iteration starting at `now`
    # ... the iteration's effects happen at now + result.duration_s:
    #     deliver result.outputs, publish result.kv_events, then step again.

`step` returns `duration_s == 0` and nothing else when there is no work; the driver then waits
for the next `submit` or `abort`. A step may also return `duration_s == 0` *with* outputs (the
finished-abort outputs of requests aborted while nothing else ran): deliver them all the same.
Everything here is plain data: no asyncio, no sockets, no clock reads. The engine is deterministic
for a given seed and sequence of calls.

A step's KV events are the one shared set in `services.common.sglang.kv_events` (the router decodes the same
dataclasses from the wire); this module names them for the engine's users.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol, Sequence

from services.common.settings.errors import ConfigError
from services.common.sglang.kv_events import KvEvent
from services.simworker.core.radix import PageChain

WritePolicy = Literal["write_back", "write_through", "write_through_selective"]


@dataclass(frozen=True)
class EngineRequest:
    rid: str
    input_ids: Sequence[int]
    """Token ids (a tuple, or an array('I'), which the engine copies without converting each id)."""
    max_new_tokens: int
    priority: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    # Output length the engine generates before a natural stop, when not ignore_eos.
    # None = the engine draws one deterministically from the seed and rid.
    target_output_tokens: int | None = None
    # The `PageChain` of input_ids (its complete pages at the engine's page size), when the caller
    # has it already: the engine takes a computed prompt page's digest from it instead of hashing
    # the page. The simulator passes the one its conversation extends turn by turn; the HTTP
    # server passes none. It must be the chain of input_ids (the engine checks its length at
    # submit, and reads no further: its holder may extend it in place afterwards).
    prompt_pages: PageChain | None = None


class RequestOutput(NamedTuple):
    """New tokens of one request produced by one step (one entry per request that progressed).

    Immutable, as a frozen dataclass would be, but a named tuple: the engine makes one per
    request per step, and building a tuple costs a fraction of a frozen dataclass's __init__."""

    rid: str
    new_token_ids: tuple[int, ...]
    prompt_tokens: int
    completion_tokens: int  # so far, including new_token_ids
    cached_tokens: int  # prompt tokens served from GPU radix cache or host tier
    finished: bool = False
    # SGLang's shape: {"type": "stop", "matched": id} | {"type": "length", "length": n}
    #                 | {"type": "abort", "message": "..."}; None while running.
    finish_reason: dict | None = None
    num_retractions: int = 0
    host_cached_tokens: int = 0  # part of cached_tokens loaded back from the host tier
    admitted_at: float | None = None
    """When the request first left the waiting queue (its prefill began), in the `now` of the step that
    admitted it; None if it never did (aborted while queued). Queue wait = admitted_at - arrival."""


@dataclass(frozen=True)
class StepResult:
    duration_s: float
    outputs: tuple[RequestOutput, ...] = ()
    kv_events: tuple[KvEvent, ...] = ()


@dataclass(frozen=True)
class EngineStats:
    """Gauges and monotonically increasing counters, read by /metrics, /server_info and benches."""

    num_running_reqs: int = 0
    num_queue_reqs: int = 0
    num_used_tokens: int = 0  # GPU tokens held by running requests and the cache
    token_usage: float = 0.0  # used / max_total_tokens
    cache_hit_rate: float = 0.0  # cached / prompt tokens over a recent window
    gen_throughput: float = 0.0  # tokens/s over a recent window of virtual time
    host_used_tokens: int = 0
    host_total_tokens: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    cached_tokens_total: int = 0
    host_cached_tokens_total: int = 0
    recomputed_tokens_total: int = 0  # prefill of tokens this engine had computed before for that prefix
    retractions_total: int = 0
    preemptions_total: int = 0  # running requests preempted for a higher-priority one
    host_loadbacks_total: int = 0  # requests that loaded a prefix back from host
    host_loadback_tokens_total: int = 0
    evicted_tokens_total: int = 0
    requests_total: int = 0
    aborted_requests_total: int = 0


class Engine(Protocol):
    def submit(self, request: EngineRequest, now: float) -> None:
        """Queue a request. Raises ValueError for a request the engine can never serve
        (prompt + 1 longer than the context length or the KV pool)."""

    def abort(self, rid: str, now: float) -> bool:
        """Abort a queued or running request; its next output is a finished abort. False if unknown."""

    def step(self, now: float) -> StepResult:
        """Run one iteration: admit, chunked prefill, decode one token per running request."""

    def flush_cache(self) -> bool:
        """Drop every unreferenced cached page. False (refused) while requests are running or queued."""

    def has_work(self) -> bool: ...

    def stats(self) -> EngineStats: ...


@dataclass(frozen=True)
class EngineConfig:
    """Engine sizing, mirroring SGLang's server arguments of the same names."""

    max_total_tokens: int = 65_536
    page_size: int = 16
    max_running_requests: int = 256
    chunked_prefill_size: int = 8_192
    context_length: int = 131_072
    enable_hierarchical_cache: bool = False
    hicache_ratio: float = 2.0
    hicache_size_tokens: int = 0  # > 0 overrides hicache_ratio
    hicache_write_policy: WritePolicy = "write_through"
    enable_priority_scheduling: bool = False
    schedule_low_priority_values_first: bool = False
    disable_priority_preemption: bool = False
    priority_scheduling_preemption_threshold: int = 10
    """With priority scheduling, a queued request that finds the running set full preempts running
    requests whose priority it beats by more than this (SGLang's default, 10)."""
    seed: int = 0
    emit_kv_events: bool = True
    """False when nothing subscribes to KV events (no --kv-events-config, the offline
    simulator): the engine then skips building them. Scheduling is identical either way."""
    stream_outputs: bool = True
    """True (the server, which streams every token): a request that progressed in a step gets an
    output of that step's tokens. False (the offline simulator, which needs only when the first
    token came and the whole answer): a running request gets an output for its first token, then
    none until it ends, when one output carries every token since. Scheduling, counters and the
    tokens themselves are identical either way; only fewer outputs are made."""

    def __post_init__(self) -> None:
        if self.page_size < 1:
            raise ConfigError("page_size", self.page_size, ">= 1")
        if self.max_total_tokens < self.page_size:
            raise ConfigError("max_total_tokens", self.max_total_tokens, ">= page_size")
        if self.max_running_requests < 1:
            raise ConfigError("max_running_requests", self.max_running_requests, ">= 1")
        if self.chunked_prefill_size < 1:
            raise ConfigError("chunked_prefill_size", self.chunked_prefill_size, ">= 1")
        if self.priority_scheduling_preemption_threshold < 0:
            raise ConfigError(
                "priority_scheduling_preemption_threshold", self.priority_scheduling_preemption_threshold, ">= 0"
            )
        if self.context_length < 2:
            raise ConfigError("context_length", self.context_length, ">= 2")
        if self.hicache_write_policy not in ("write_back", "write_through", "write_through_selective"):
            raise ConfigError(
                "hicache_write_policy",
                self.hicache_write_policy,
                "one of write_back, write_through, write_through_selective",
            )
        if self.hicache_size_tokens < 0:
            raise ConfigError("hicache_size_tokens", self.hicache_size_tokens, ">= 0")
        if self.enable_hierarchical_cache:
            if self.hicache_size_tokens == 0 and not self.hicache_ratio > 1.0:
                # SGLang requires the host pool to be larger than the device pool.
                raise ConfigError("hicache_ratio", self.hicache_ratio, "> 1 when hicache_size is 0")
            if self.host_tokens() < self.page_size:
                raise ConfigError("hicache_size_tokens", self.host_tokens(), ">= page_size")

    def host_tokens(self) -> int:
        """Host-tier capacity in tokens: hicache_size_tokens if > 0, else hicache_ratio x GPU pool."""
        if self.hicache_size_tokens > 0:
            return self.hicache_size_tokens
        return int(self.max_total_tokens * self.hicache_ratio)
