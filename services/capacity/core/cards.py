"""Worker cards and the retention budget. Pure: no I/O, no clock.

`derive_card(info)` turns one SGLang `/server_info` body into a `Card` or a typed
`CardRejection`; `recompute(settings, workers)` turns a snapshot of every worker's state into
the list of schedulable replicas (one per `(worker_id, dp_rank)`) and their retention budget.

Derivation rules (reference/thunderagent.md §2.4, §2.5):

* GPU tokens `G = ceil(max_total_num_tokens / page_size) * page_size`; the raw
  `max_total_num_tokens` is `D`. SGLang reports it per DP rank, so every rank gets the same `G`.
* Native HiCache host tokens `H`, only when `enable_hierarchical_cache` is true:
  1. `hicache_host_total_tokens` present -> `H = positive_int(value)`; present but invalid
     means no host tokens (no fallback to derivation).
  2. otherwise `hicache_size == 0` (ratio sizing) -> `H = (floor(D * hicache_ratio) // page_size + 1)
     * page_size`, as SGLang sizes its host pool; not derived under DCP (`dcp_size > 1`) or for
     DeepSeek-V4 (its host pool is laid out differently).
  3. otherwise an explicit `hicache_size` in GB -> derived the same way from
     `floor(hicache_size * 1e9 / kv_bytes_per_token)` when the card carries `kv_bytes_per_token`
     (the simworker reports it; stock SGLang does not), else no host tokens.
  Then the write policy: `write_back` counts `H` (host pool disjoint from GPU), `write_through`
  counts `H - D` (host mirrors GPU; `<= 0` -> none), anything else counts none.
* A HiCache storage backend (mooncake, file, ...) is reported, never counted.
* Retention per replica = `G + H` (uncapped, [CORE]); with `cap_host_at_gpu`, `G + min(H, G)`
  ([LATEST], PR #14389, opt-in because it was never merged nor validated).
* Degradations (`degradations(info)`): each server argument Bandmaster relies on that is not an
  explicit `true` (`enable_cache_report`, `enable_priority_scheduling`) is a `Degradation` on the
  card. It never rejects the card nor changes the budget: the worker serves, Bandmaster knows less.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from services.capacity.core.state import (
    Card,
    CardRejection,
    CardRejectReason,
    Degradation,
    Health,
    HostNotCounted,
    RetentionSource,
    WorkerState,
)

# Beyond these a figure is a bug or an attack, not a server: 2**40 tokens is ~1e12, three orders
# of magnitude above the largest KV pools in existence.
MAX_TOKENS = 2**40
MAX_PAGE_SIZE = 2**16
MAX_DP_SIZE = 4096
MAX_HICACHE_SIZE_GB = 2**20  # a petabyte of host memory per server
MAX_TEXT_CHARS = 512  # model names, versions, policies: they travel in every snapshot
TEXT_FIELDS = ("served_model_name", "model_path", "version", "hicache_write_policy", "hicache_storage_backend")
_INT32_MAX = 2**31 - 1
_SHOW_CHARS = 40

_COUNTED_POLICIES = ("write_back", "write_through")


def positive_int(value: Any) -> int | None:
    """The shared validity rule: an int or finite float, not a bool, truncated, > 0; else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        value = int(value)
    return value if value > 0 else None


def _number(value: Any) -> int | float | None:
    """An int or float JSON number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value


def _finite(value: int | float) -> bool:
    # math.isfinite() raises OverflowError on ints beyond a float's range; ints are finite.
    return isinstance(value, int) or math.isfinite(value)


def _show(value: Any) -> str:
    """A short rendering of any JSON value for rejection details: never long, never raises."""
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        # str() of an int with more than 4300 digits raises ValueError; big ones are shown by size.
        return (
            str(value)
            if -(10**18) < value < 10**18
            else f"{'-' if value < 0 else ''}<{value.bit_length()}-bit integer>"
        )
    if isinstance(value, str):
        # repr() escapes what UTF-8 cannot encode (lone surrogates), so the detail always encodes.
        return repr(value) if len(value) <= _SHOW_CHARS else f"{value[:_SHOW_CHARS]!r}... ({len(value)} chars)"
    if isinstance(value, Mapping):
        return "a JSON object"
    if isinstance(value, (list, tuple)):
        return "a JSON array"
    return f"a {type(value).__name__}"


def _strict_positive_int(value: Any) -> int | None:
    """An int (or an integral float) > 0 and not a bool: for counts such as dp_size."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and value > 0:
        return value
    return None


def _reject(reason: CardRejectReason, detail: str) -> CardRejection:
    return CardRejection(reason, detail)


def _tokens(info: Mapping[str, Any]) -> int | CardRejection:
    raw = info.get("max_total_num_tokens")
    if raw is None:
        return _reject(CardRejectReason.MAX_TOTAL_NUM_TOKENS_MISSING, "max_total_num_tokens missing")
    tokens = positive_int(raw)
    if tokens is None:
        return _reject(
            CardRejectReason.MAX_TOTAL_NUM_TOKENS_INVALID, f"max_total_num_tokens {_show(raw)} is not a positive number"
        )
    if tokens > MAX_TOKENS:
        return _reject(
            CardRejectReason.MAX_TOTAL_NUM_TOKENS_ABSURD, f"max_total_num_tokens {_show(raw)} exceeds {MAX_TOKENS}"
        )
    return tokens


def _page_size(info: Mapping[str, Any]) -> int | CardRejection:
    raw = info.get("page_size")
    if raw is None:
        # SGLang resolves a None page size to 1 before serving, so a missing one means this is
        # not the server we think it is; do not guess.
        return _reject(CardRejectReason.PAGE_SIZE_MISSING, "page_size missing")
    page = _strict_positive_int(raw)
    if page is None:
        return _reject(CardRejectReason.PAGE_SIZE_INVALID, f"page_size {_show(raw)} is not a positive integer")
    if page > MAX_PAGE_SIZE:
        return _reject(CardRejectReason.PAGE_SIZE_ABSURD, f"page_size {_show(raw)} exceeds {MAX_PAGE_SIZE}")
    return page


def _dp_size(info: Mapping[str, Any]) -> int | CardRejection:
    raw = info.get("dp_size")
    if raw is None:
        return 1  # not a DP deployment
    dp = _strict_positive_int(raw)
    if dp is None:
        return _reject(CardRejectReason.DP_SIZE_INVALID, f"dp_size {_show(raw)} is not a positive integer")
    if dp > MAX_DP_SIZE:
        return _reject(CardRejectReason.DP_SIZE_ABSURD, f"dp_size {_show(raw)} exceeds {MAX_DP_SIZE}")
    return dp


def round_up_to_pages(tokens: int, page_size: int) -> int:
    if page_size <= 1:
        return tokens
    return -(-tokens // page_size) * page_size


def _host_pool_tokens(pool_tokens: int, page_size: int) -> int:
    """SGLang's host pool sizing: whole pages plus one (memory_pool_host.py aligns up that way)."""
    page = max(page_size, 1)
    return (pool_tokens // page + 1) * page


def _is_deepseek_v4(info: Mapping[str, Any]) -> bool:
    architectures = info.get("architectures")
    names = [
        info.get("model_path"),
        info.get("served_model_name"),
        *(architectures if isinstance(architectures, list) else ()),
    ]
    for name in names:
        if isinstance(name, str):
            flat = name.lower().replace("-", "").replace("_", "")
            if "deepseekv4" in flat:
                return True
    return False


def host_tokens(
    info: Mapping[str, Any], device_tokens: int, page_size: int
) -> tuple[int, HostNotCounted | None] | CardRejection:
    """Native HiCache host tokens to count, or (0, why not). Call only with HiCache enabled.

    A figure of the wrong type or an unsupported setup counts no host tokens (the budget is GPU
    only); a well-formed figure no machine can have (a host pool above MAX_TOKENS) rejects the card.
    """
    if "hicache_host_total_tokens" in info:
        raw = info["hicache_host_total_tokens"]
        host = positive_int(raw)
        if host is None:
            return 0, HostNotCounted.HOST_TOKENS_INVALID
        if host > MAX_TOKENS:
            return _reject(
                CardRejectReason.HICACHE_HOST_TOTAL_TOKENS_ABSURD,
                f"hicache_host_total_tokens {_show(raw)} exceeds {MAX_TOKENS}",
            )
    else:
        raw = info.get("hicache_size", 0)
        size_gb = _number(0 if raw is None else raw)
        if size_gb is None or not _finite(size_gb) or size_gb < 0:
            return 0, HostNotCounted.HICACHE_SIZE_INVALID
        if size_gb > 0:
            if size_gb > MAX_HICACHE_SIZE_GB:
                return _reject(
                    CardRejectReason.HICACHE_SIZE_ABSURD, f"hicache_size {_show(raw)} exceeds {MAX_HICACHE_SIZE_GB} GB"
                )
            bytes_per_token = positive_int(info.get("kv_bytes_per_token"))
            if bytes_per_token is None:
                return 0, HostNotCounted.EXPLICIT_SIZE_WITHOUT_BYTES_PER_TOKEN
            host = _host_pool_tokens(int(size_gb * 1e9 // bytes_per_token), page_size)
            if host > MAX_TOKENS:
                return _reject(
                    CardRejectReason.HICACHE_SIZE_ABSURD,
                    f"hicache_size {_show(raw)} GB at {bytes_per_token} bytes per token exceeds "
                    f"{MAX_TOKENS} host tokens",
                )
        else:
            dcp = info.get("dcp_size")
            if dcp is not None and not (isinstance(dcp, int) and not isinstance(dcp, bool) and dcp <= 1):
                return 0, HostNotCounted.DCP_UNSUPPORTED
            if _is_deepseek_v4(info):
                return 0, HostNotCounted.MODEL_UNSUPPORTED
            raw_ratio = info.get("hicache_ratio")
            ratio = _number(raw_ratio)
            if ratio is None or not _finite(ratio) or ratio <= 0:
                return 0, HostNotCounted.RATIO_INVALID
            # Bounded before multiplying, so the product is a finite float (or an exact int).
            host = (
                MAX_TOKENS + 1
                if ratio > MAX_TOKENS
                else _host_pool_tokens(math.floor(device_tokens * ratio), page_size)
            )
            if host > MAX_TOKENS:
                return _reject(
                    CardRejectReason.HICACHE_RATIO_ABSURD,
                    f"hicache_ratio {_show(raw_ratio)} x max_total_num_tokens {device_tokens} exceeds "
                    f"{MAX_TOKENS} host tokens",
                )
    policy = info.get("hicache_write_policy")
    if not isinstance(policy, str) or not policy:
        return 0, HostNotCounted.WRITE_POLICY_MISSING
    if policy == "write_back":
        return host, None
    if policy == "write_through":
        counted = host - device_tokens
        return (counted, None) if counted > 0 else (0, HostNotCounted.FULLY_MIRRORED)
    return 0, HostNotCounted.WRITE_POLICY_NOT_COUNTED


def _text_field(info: Mapping[str, Any], name: str) -> str | CardRejection:
    """A string field carried into the card: "" when absent or not a string; too long or not
    encodable (it would break every snapshot that carries it) rejects the card."""
    value = info.get(name)
    if not isinstance(value, str):
        return ""
    if len(value) > MAX_TEXT_CHARS:
        return _reject(
            CardRejectReason.TEXT_FIELD_TOO_LONG, f"{name} {_show(value)} exceeds {MAX_TEXT_CHARS} characters"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return _reject(CardRejectReason.TEXT_FIELD_INVALID, f"{name} {_show(value)} is not encodable as UTF-8")
    return value


def degradations(info: Mapping[str, Any]) -> tuple[Degradation, ...]:
    """The reasons this server makes Bandmaster know less, in declaration order (() = none).

    Only JSON `true` is on: SGLang publishes every server argument, so an absent or non-boolean
    value means the server does not say it does this.
    """
    return tuple(d for d in Degradation if info.get(d.server_arg) is not True)


def derive_card(info: Any) -> Card | CardRejection:
    """One /server_info JSON value -> Card, or the first rule it breaks."""
    if not isinstance(info, Mapping):
        return _reject(CardRejectReason.NOT_AN_OBJECT, f"body is a JSON {type(info).__name__}, not an object")
    device = _tokens(info)
    if isinstance(device, CardRejection):
        return device
    page = _page_size(info)
    if isinstance(page, CardRejection):
        return page
    dp = _dp_size(info)
    if isinstance(dp, CardRejection):
        return dp
    texts: dict[str, str] = {}
    for name in TEXT_FIELDS:
        text = _text_field(info, name)
        if isinstance(text, CardRejection):
            return text
        texts[name] = text
    hierarchical = info.get("enable_hierarchical_cache") is True
    host_outcome = host_tokens(info, device, page) if hierarchical else (0, None)
    if isinstance(host_outcome, CardRejection):
        return host_outcome
    host, not_counted = host_outcome
    dp_attention = info.get("enable_dp_attention") is True
    max_running = _strict_positive_int(info.get("max_running_requests")) or 0
    if dp_attention and dp > 1:
        # Under DP attention the server argument is global; each rank schedules its share.
        max_running //= dp
    if max_running > _INT32_MAX:
        max_running = 0
    context = _strict_positive_int(info.get("context_length")) or 0
    return Card(
        gpu_kv_tokens=round_up_to_pages(device, page),
        device_tokens=device,
        page_size=page,
        host_kv_tokens=host,
        host_not_counted=not_counted,
        hierarchical_cache=hierarchical,
        hicache_write_policy=texts["hicache_write_policy"] if hierarchical else "",
        hicache_storage_backend=texts["hicache_storage_backend"],
        dp_size=dp,
        dp_attention=dp_attention,
        max_running_requests=max_running,
        context_length=context if context <= MAX_TOKENS else 0,
        model_name=texts["served_model_name"] or texts["model_path"],
        version=texts["version"],
        degraded=degradations(info),
    )


def parse_card(body: bytes | str) -> Card | CardRejection:
    try:
        info = json.loads(body)
    except RecursionError:
        return _reject(CardRejectReason.JSON_TOO_DEEP, "JSON nested too deeply")
    except (ValueError, UnicodeDecodeError) as exc:
        return _reject(CardRejectReason.MALFORMED_JSON, f"malformed JSON ({exc.__class__.__name__})")
    return derive_card(info)


class CardCache:
    """Each worker's last parsed card, reused while its `/server_info` body is byte-for-byte the same.

    A body repeats only while its worker is idle: SGLang (and simworker) bodies carry per-poll figures
    (`internal_states`), so under load every poll is new. Keeping one body per worker gets every hit a
    cache of old bodies could get (a worker never goes back to an old body) at memory bounded by the fleet;
    an LRU of old bodies had a hit rate near 0 under load and grew for minutes (the soak's capacity RSS).
    """

    def __init__(self) -> None:
        self._last: dict[str, tuple[bytes, Card | CardRejection]] = {}
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._last)

    def parse(self, worker: str, body: bytes) -> Card | CardRejection:
        last = self._last.get(worker)
        if last is not None and last[0] == body:
            self.hits += 1
            return last[1]
        self.misses += 1
        result = parse_card(body)
        self._last[worker] = (body, result)
        return result

    def forget(self, worker: str) -> None:
        self._last.pop(worker, None)


@dataclass(frozen=True)
class RetentionSettings:
    cap_host_at_gpu: bool = False
    """Count at most G host tokens per replica (G + min(H, G)). Off: G + H, uncapped."""


@dataclass(frozen=True)
class ReplicaView:
    worker_id: str
    dp_rank: int
    retention_tokens: int
    source: RetentionSource
    gpu_kv_tokens: int
    host_kv_tokens: int  # host tokens actually counted (after the optional cap)
    max_programs: int  # 0 = no limit


@dataclass(frozen=True)
class WorkerView:
    state: WorkerState
    replicas: tuple[ReplicaView, ...]
    excluded_reason: str  # empty when the worker contributes budget


@dataclass(frozen=True)
class CapacityView:
    workers: tuple[WorkerView, ...]
    total_retention_tokens: int
    replica_count: int

    def replicas(self) -> list[ReplicaView]:
        return [r for w in self.workers for r in w.replicas]


def host_counted(card: Card, settings: RetentionSettings) -> int:
    """Host tokens counted per rank: all of them, or at most G with the cap."""
    return min(card.host_kv_tokens, card.gpu_kv_tokens) if settings.cap_host_at_gpu else card.host_kv_tokens


def card_retention_tokens(card: Card, settings: RetentionSettings) -> int:
    """The worker's whole budget from this card: (G + counted H) per rank, times the ranks."""
    return (card.gpu_kv_tokens + host_counted(card, settings)) * card.dp_size


def replicas_for(worker_id: str, card: Card, settings: RetentionSettings) -> tuple[ReplicaView, ...]:
    gpu = card.gpu_kv_tokens
    host = host_counted(card, settings)
    source = RetentionSource.GPU_PLUS_HOST if host > 0 else RetentionSource.GPU_ONLY
    return tuple(
        ReplicaView(worker_id, rank, gpu + host, source, gpu, host, card.max_running_requests)
        for rank in range(card.dp_size)
    )


def exclusion(state: WorkerState) -> str:
    """Why this worker contributes no budget, or "" if it does. Always the latest poll's outcome:
    a failure clears an earlier rejection or mismatch, an answer clears an earlier failure."""
    if state.rejection is not None:
        return str(state.rejection)
    if state.mismatch:
        return state.mismatch
    if state.recovering:
        return state.recovering
    if state.health is Health.PENDING:
        last = f" (last: {state.last_failure.value})" if state.last_failure else ""
        return f"pending: no successful poll yet{last}"
    if state.health is Health.UNHEALTHY:
        last = state.last_failure.value if state.last_failure else "unknown"
        return f"unhealthy: polls failing (last: {last})"
    if state.card is None:
        return "no card"
    return ""


def recompute(settings: RetentionSettings, workers: Sequence[WorkerState]) -> CapacityView:
    """A fresh view from a snapshot of every worker; ordered by worker_id for stable output."""
    views: list[WorkerView] = []
    total = 0
    count = 0
    for state in sorted(workers, key=lambda s: s.worker_id):
        reason = exclusion(state)
        replicas: tuple[ReplicaView, ...] = ()
        if not reason and state.card is not None:
            replicas = replicas_for(state.worker_id, state.card, settings)
            total += sum(r.retention_tokens for r in replicas)
            count += len(replicas)
        views.append(WorkerView(state, replicas, reason))
    return CapacityView(tuple(views), total, count)
