"""Timing profiles: how long one engine step takes, as a function of what the step holds.

One parametric family covers both shipped profiles (all times in milliseconds):

    step_ms = decode_ms(x)                              if the step decodes (or always, when
                                                        decode_on_prefill_only_steps)
            + prefill_step_base_ms + prefill_batch_quad_ms * T_batch**2   if the step prefills
            + sum over prefill chunks [ prefill_ms_per_token * T
                                        + prefill_attn_ms_per_token2 * T * (P + T/2) ]
            + host load-back: tokens * kv_bytes_per_token / host_bandwidth_bytes_per_s

    decode_ms(x) = max(decode_min_ms, e0 + e1*x + e2*x**2), continued linearly with the slope
                   at decode_x_knee above it (knee 0 = no knee)
    x = A/1000, the summed context tokens of the requests decoding in the step ("context_k"),
        or active KV tokens / pool tokens ("kv_utilisation", the Dynamo mocker's p).

T is a chunk's uncached tokens, P the tokens of that request already in KV when the chunk
runs, T_batch the step's total prefill tokens.

* ``glm45-fp8-h200`` (the default) is TIMING.md §6: decode-only ITL in the batch context plus
  per-chunk GEMM + attention cost, paid inside the same step, so a big prefill delays every
  decoding request as on the real server. ``frontend_*`` is the off-GPU client/HTTP/tokenize
  latency that the measured TTFT includes; the engine does not apply it (a driver that wants
  client-side TTFT adds `frontend_s` before submitting).
* ``mocker-h100`` is Dynamo's mocker polynomial (reference/kvrouter_sglang.md §B.6, item 2).

Profiles are JSON files shipped in ``profiles/``. A user file (JSON or TOML) may name
``"base": "<profile>"`` and override some fields. Reading them is the shell's
(services/simworker/profiles.py `load_profile`); this module turns the fields read into a
`TimingProfile` (`profile_from_fields`) and does no I/O.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

from services.common.settings.errors import ConfigError

DEFAULT_PROFILE = "glm45-fp8-h200"
_DECODE_X = ("context_k", "kv_utilisation")


@dataclass(frozen=True)
class TimingProfile:
    name: str
    decode_x: str
    """"context_k" (A/1000, summed context of decoding requests) or "kv_utilisation"."""
    decode_e0_ms: float
    decode_e1_ms: float
    decode_e2_ms: float
    decode_x_knee: float
    """Above this x, decode time continues linearly with the slope at the knee; 0 = none."""
    decode_min_ms: float
    decode_on_prefill_only_steps: bool
    """True: every step pays decode_ms (its e0 is the fixed step cost), prefill-only ones too."""
    prefill_step_base_ms: float
    prefill_batch_quad_ms: float
    prefill_ms_per_token: float
    prefill_attn_ms_per_token2: float
    frontend_base_ms: float
    frontend_ms_per_token: float
    kv_bytes_per_token: int
    """KV bytes per token across the whole replica (all TP/PP ranks), for host-tier sizing."""
    host_bandwidth_bytes_per_s: float
    """Host -> GPU load-back bandwidth of the HiCache tier (an assumption; override it)."""
    kv_capacity_tokens: int
    """The KV pool size this profile was measured at (a suggestion for --max-total-tokens)."""
    step_token_budget: int
    """Tokens per step the measured server ran with (its chunked-prefill budget)."""
    source: str = ""
    model: str = ""
    """The model (a Hugging Face id such as meta-llama/Llama-3.1-8B-Instruct) whose timing this is; the
    planner refuses the profile when it was told to plan for another model (--worker-model)."""

    def __post_init__(self) -> None:
        if self.decode_x not in _DECODE_X:
            raise ConfigError("decode_x", self.decode_x, f"one of {_DECODE_X}")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f.name, value, "must be finite")
        nonneg = (
            "decode_min_ms",
            "decode_x_knee",
            "prefill_step_base_ms",
            "prefill_batch_quad_ms",
            "prefill_ms_per_token",
            "prefill_attn_ms_per_token2",
            "frontend_base_ms",
            "frontend_ms_per_token",
        )
        for name in nonneg:
            if getattr(self, name) < 0:
                raise ConfigError(name, getattr(self, name), ">= 0")
        if self.decode_e0_ms < 0:
            raise ConfigError("decode_e0_ms", self.decode_e0_ms, ">= 0")
        if self.kv_bytes_per_token <= 0:
            raise ConfigError("kv_bytes_per_token", self.kv_bytes_per_token, "> 0")
        if self.host_bandwidth_bytes_per_s <= 0:
            raise ConfigError("host_bandwidth_bytes_per_s", self.host_bandwidth_bytes_per_s, "> 0")
        if self.kv_capacity_tokens <= 0:
            raise ConfigError("kv_capacity_tokens", self.kv_capacity_tokens, "> 0")
        if self.step_token_budget <= 0:
            raise ConfigError("step_token_budget", self.step_token_budget, "> 0")
        # A decode polynomial that turns down before its knee would make a fuller batch faster.
        knee = self.decode_x_knee
        if knee > 0 and self.decode_e1_ms + 2 * self.decode_e2_ms * knee < 0:
            raise ConfigError("decode_x_knee", knee, "decode slope e1 + 2*e2*knee must be >= 0")

    # -- formulas (milliseconds in, seconds out where the name says _s) ----------------------

    def decode_ms(self, context_tokens: int, pool_tokens: int) -> float:
        if self.decode_x == "context_k":
            x = context_tokens / 1000.0
        else:
            x = context_tokens / pool_tokens if pool_tokens > 0 else 0.0
        e0, e1, e2 = self.decode_e0_ms, self.decode_e1_ms, self.decode_e2_ms
        knee = self.decode_x_knee
        if knee > 0 and x > knee:
            value = e0 + e1 * knee + e2 * knee * knee + (e1 + 2 * e2 * knee) * (x - knee)
        else:
            value = e0 + e1 * x + e2 * x * x
        return max(self.decode_min_ms, value)

    def prefill_chunk_ms(self, new_tokens: int, prefix_tokens: int) -> float:
        t = new_tokens
        return self.prefill_ms_per_token * t + self.prefill_attn_ms_per_token2 * t * (prefix_tokens + t / 2.0)

    def prefill_batch_ms(self, batch_tokens: int) -> float:
        return self.prefill_step_base_ms + self.prefill_batch_quad_ms * batch_tokens * batch_tokens

    def host_load_s(self, tokens: int) -> float:
        return tokens * self.kv_bytes_per_token / self.host_bandwidth_bytes_per_s

    def frontend_s(self, prompt_tokens: int) -> float:
        """Off-GPU latency of one request (client, HTTP, tokenization) that TIMING.md's TTFT includes."""
        return (self.frontend_base_ms + self.frontend_ms_per_token * prompt_tokens) / 1000.0

    def host_tokens_for_bytes(self, size_bytes: float) -> int:
        return int(size_bytes // self.kv_bytes_per_token)


def host_tokens_from_gb(size_gb: float, kv_bytes_per_token: int) -> int:
    """SGLang's --hicache-size (GB, 1e9 bytes) as host-tier capacity in tokens."""
    if size_gb < 0:
        raise ConfigError("hicache_size", size_gb, ">= 0")
    if kv_bytes_per_token <= 0:
        raise ConfigError("kv_bytes_per_token", kv_bytes_per_token, "> 0")
    return int(size_gb * 1e9 // kv_bytes_per_token)


_FIELDS = {f.name: f for f in dataclasses.fields(TimingProfile)}


def _coerce(name: str, value: Any) -> Any:
    field = _FIELDS.get(name)
    if field is None:
        raise ConfigError(f"profile.{name}", value, f"unknown profile field; known: {sorted(_FIELDS)}")
    kind = (
        field.type
        if isinstance(field.type, type)
        else {"str": str, "float": float, "int": int, "bool": bool}[str(field.type)]
    )
    try:
        if kind is bool:
            if isinstance(value, str):
                lowered = value.strip().lower()
                if lowered not in ("true", "false", "1", "0"):
                    raise ValueError("expected true/false")
                return lowered in ("true", "1")
            if not isinstance(value, bool):
                raise ValueError("expected a boolean")
            return value
        if kind is int:
            if isinstance(value, float) and value.is_integer():
                return int(value)
            if isinstance(value, bool):
                raise ValueError("expected an integer")
            return int(value)
        if kind is float:
            if isinstance(value, bool):
                raise ValueError("expected a number")
            return float(value)
        return str(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"profile.{name}", value, str(exc)) from exc


def profile_from_fields(
    fields: Mapping[str, Any], overrides: Mapping[str, Any] | None = None, *, label: str
) -> TimingProfile:
    """A profile from its fields (a base profile's already merged under a derived file's), then `overrides`.

    Values may be strings (flags) and are coerced to each field's type. `label` (the profile's name or
    path) is named in the error for missing fields; an unknown field or a bad value raises ConfigError
    naming `profile.<field>`."""
    data = dict(fields)
    data.update(overrides or {})
    values = {k: _coerce(k, v) for k, v in data.items()}
    missing = sorted(n for n, f in _FIELDS.items() if n not in values and f.default is dataclasses.MISSING)
    if missing:
        raise ConfigError("profile", label, f"missing fields {missing}")
    return TimingProfile(**values)
