"""Plain data shared by the card parser, the registry and `recompute`.

Everything here is immutable: the registry replaces a `WorkerState` on every change, so a
snapshot of the registry is just a tuple of references that `recompute` can read without locks.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Origin(enum.Enum):
    FLAG = "flag"
    CONFIG_FILE = "config_file"
    RPC = "rpc"


class Health(enum.Enum):
    PENDING = "PENDING"  # registered, no successful poll yet
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"  # N failed polls in a row, or a card that cannot be trusted


class RetentionSource(enum.Enum):
    GPU_ONLY = "GPU_ONLY"
    GPU_PLUS_HOST = "GPU_PLUS_HOST"


class CardRejectReason(enum.Enum):
    """Why a /server_info body yields no budget at all. The value is a metric label."""

    MALFORMED_JSON = "malformed_json"
    JSON_TOO_DEEP = "json_too_deep"
    BODY_TOO_LARGE = "body_too_large"
    NOT_AN_OBJECT = "not_an_object"
    MAX_TOTAL_NUM_TOKENS_MISSING = "max_total_num_tokens_missing"
    MAX_TOTAL_NUM_TOKENS_INVALID = "max_total_num_tokens_invalid"
    MAX_TOTAL_NUM_TOKENS_ABSURD = "max_total_num_tokens_absurd"
    PAGE_SIZE_MISSING = "page_size_missing"
    PAGE_SIZE_INVALID = "page_size_invalid"
    PAGE_SIZE_ABSURD = "page_size_absurd"
    DP_SIZE_INVALID = "dp_size_invalid"
    DP_SIZE_ABSURD = "dp_size_absurd"
    # HiCache figures that no running server can have (the host pool would not fit in any machine):
    HICACHE_HOST_TOTAL_TOKENS_ABSURD = "hicache_host_total_tokens_absurd"
    HICACHE_RATIO_ABSURD = "hicache_ratio_absurd"
    HICACHE_SIZE_ABSURD = "hicache_size_absurd"
    TEXT_FIELD_TOO_LONG = "text_field_too_long"
    TEXT_FIELD_INVALID = "text_field_invalid"  # not encodable as UTF-8 (a lone surrogate)
    DERIVATION_ERROR = "derivation_error"  # a bug in the derivation, caught by the shell


class HostNotCounted(enum.Enum):
    """Why a card with HiCache enabled still counts no host tokens (the budget is GPU only)."""

    HOST_TOKENS_INVALID = "host_tokens_invalid"  # reported but not a positive int
    EXPLICIT_SIZE_WITHOUT_BYTES_PER_TOKEN = "explicit_size_without_bytes_per_token"
    HICACHE_SIZE_INVALID = "hicache_size_invalid"
    RATIO_INVALID = "ratio_invalid"
    DCP_UNSUPPORTED = "dcp_unsupported"
    MODEL_UNSUPPORTED = "model_unsupported"
    WRITE_POLICY_MISSING = "write_policy_missing"
    WRITE_POLICY_NOT_COUNTED = "write_policy_not_counted"  # write_through_selective or unknown
    FULLY_MIRRORED = "fully_mirrored"  # write_through with H <= D


class Degradation(enum.Enum):
    """A server argument that is off and makes Bandmaster know less. The value is a metric label.

    Only an explicit `true` in /server_info counts as on: SGLang publishes every server argument
    there, so a missing one means the server does not say it does this, and it is treated as off.
    """

    CACHE_REPORT_OFF = "cache_report_off"
    PRIORITY_SCHEDULING_OFF = "priority_scheduling_off"

    @property
    def server_arg(self) -> str:
        """The /server_info key (SGLang's ServerArgs field) this reason reads."""
        return _DEGRADATION_ARG[self][0]

    @property
    def flag(self) -> str:
        """The SGLang flag that turns it on."""
        return "--" + self.server_arg.replace("_", "-")

    @property
    def consequence(self) -> str:
        """What Bandmaster loses while it is off, in a few words."""
        return _DEGRADATION_ARG[self][1]


_DEGRADATION_ARG = {
    Degradation.CACHE_REPORT_OFF: (
        "enable_cache_report",
        "completions carry no cached-token counts: the cost-aware policy cannot learn the prefill rate "
        "and keeps its prior (--cost-aware-prefill-tokens-per-s)",
    ),
    Degradation.PRIORITY_SCHEDULING_OFF: (
        "enable_priority_scheduling",
        "the engine ignores the priorities Bandmaster sends (resumed turns first, soft-demoted turns last)",
    ),
}


class PollFailureReason(enum.Enum):
    """Why one poll of a worker failed. The value is a metric label."""

    TIMEOUT = "timeout"
    CONNECTION = "connection"
    HTTP_STATUS = "http_status"  # /server_info answered something other than 200 (or 404 twice)
    HEALTH = "health"  # /health answered non-200
    ERROR = "error"  # the poll itself failed unexpectedly (a bug; logged with its traceback)


@dataclass(frozen=True)
class Card:
    """What we derived from one worker's /server_info. Token figures are per DP rank."""

    gpu_kv_tokens: int  # max_total_num_tokens rounded up to whole pages
    device_tokens: int  # max_total_num_tokens as reported (D in the HiCache rules)
    page_size: int
    host_kv_tokens: int  # native HiCache host tokens that may be counted; 0 = none
    host_not_counted: HostNotCounted | None
    hierarchical_cache: bool
    hicache_write_policy: str
    hicache_storage_backend: str  # reported, never counted
    dp_size: int
    dp_attention: bool
    max_running_requests: int  # per DP rank; 0 = not published
    context_length: int  # 0 = not published
    model_name: str
    version: str
    degraded: tuple[Degradation, ...] = ()  # in Degradation's declaration order; () = nothing off

    def describe(self) -> str:
        """Short human form for transition logs."""
        host = f"+host {self.host_kv_tokens}" if self.host_kv_tokens else ""
        off = f" degraded={','.join(d.value for d in self.degraded)}" if self.degraded else ""
        return (
            f"gpu_kv_tokens={self.gpu_kv_tokens}{host} page_size={self.page_size} dp_size={self.dp_size} "
            f"max_running_requests={self.max_running_requests} version={self.version or '?'}{off}"
        )


@dataclass(frozen=True)
class CardRejection:
    reason: CardRejectReason
    detail: str

    def __str__(self) -> str:
        return f"server_info: {self.detail}"


@dataclass(frozen=True)
class Load:
    """Advisory load from Heartbeat."""

    num_running_reqs: int = 0
    num_queue_reqs: int = 0
    token_usage: float = 0.0
    cache_hit_rate: float = 0.0


@dataclass(frozen=True)
class Expectation:
    """Figures a registrant said the worker has; 0 = no expectation."""

    gpu_kv_tokens: int = 0
    page_size: int = 0

    def contradiction(self, card: Card) -> str:
        """Empty when the card agrees, else why it does not."""
        if self.gpu_kv_tokens and self.gpu_kv_tokens not in (card.gpu_kv_tokens, card.device_tokens):
            return f"registration: expected_gpu_kv_tokens {self.gpu_kv_tokens} != polled {card.gpu_kv_tokens}"
        if self.page_size and self.page_size != card.page_size:
            return f"registration: expected_page_size {self.page_size} != polled {card.page_size}"
        return ""


@dataclass(frozen=True)
class WorkerState:
    """One worker as the registry knows it.

    `consecutive_failures`, `last_success_wall`, `failing_since`, `last_failure_detail` and the
    held `candidate` card are liveness bookkeeping: they change on polls without changing the
    snapshot version. Everything else is externally visible and bumps the version when it changes.
    """

    worker_id: str
    url: str
    origin: Origin
    registered_at: float  # monotonic seconds
    expectation: Expectation = Expectation()
    health: Health = Health.PENDING
    card: Card | None = None  # the published card (the one budgets are computed from)
    rejection: CardRejection | None = None
    mismatch: str = ""  # contradiction between expectation and card
    last_failure: PollFailureReason | None = None
    recovering: str = ""  # UNHEALTHY, answering well, not yet for long enough
    load: Load = Load()
    # liveness, not versioned:
    consecutive_failures: int = 0
    last_success_wall: float | None = None
    failing_since: float | None = None  # monotonic seconds: UNHEALTHY and not answering since (removal clock)
    last_failure_detail: str = ""
    candidate: Card | None = None  # a budget-raising card seen on `candidate_polls` polls in a row
    candidate_polls: int = 0

    def visible(self) -> tuple:
        """The fields whose change is an externally visible change (bumps the version)."""
        return (
            self.worker_id,
            self.url,
            self.origin,
            self.expectation,
            self.health,
            self.card,
            self.rejection,
            self.mismatch,
            self.last_failure,
            self.recovering,
            self.load,
        )
