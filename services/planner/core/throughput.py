"""Throughput model of one worker replica from a timing profile (the simworker's profile format).

The profile gives the engine's step time. For a steady stream of requests with `isl` prompt and
`osl` output tokens, at a decode batch of B requests:

    d(B)      = decode step time with B requests of mean context isl + osl/2
    p         = prefill time of one prompt (per-token GEMM + attention)
    r(B)      = B / (osl * d(B) + p)                 Little's law: B requests, each in the system
                                                     for osl steps plus its prefill
    itl(B)    = d(B) / (1 - r(B) * p)                prefills steal step time from decoding
    engine_rps = max over B with itl(B) <= itl_sla and B * (isl + osl) <= KV capacity of r(B)

An approximation (no prefix cache, mean lengths), used for throughput scaling and to derive the
batch policy's safe rate per replica when none is configured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from services.common.settings.errors import ConfigError

_PROFILE_FIELDS = (
    "decode_x",
    "decode_e0_ms",
    "decode_e1_ms",
    "decode_e2_ms",
    "decode_x_knee",
    "decode_min_ms",
    "prefill_step_base_ms",
    "prefill_ms_per_token",
    "prefill_attn_ms_per_token2",
    "kv_capacity_tokens",
)


@dataclass(frozen=True)
class EngineProfile:
    name: str
    decode_x: str  # "context_k" or "kv_utilisation"
    decode_e0_ms: float
    decode_e1_ms: float
    decode_e2_ms: float
    decode_x_knee: float
    decode_min_ms: float
    prefill_step_base_ms: float
    prefill_ms_per_token: float
    prefill_attn_ms_per_token2: float
    kv_capacity_tokens: int
    max_running_requests: int = 256
    model: str = ""  # the model whose timing this is ("" = the profile does not say)

    def decode_ms(self, x: float) -> float:
        def poly(v: float) -> float:
            return self.decode_e0_ms + self.decode_e1_ms * v + self.decode_e2_ms * v * v

        knee = self.decode_x_knee
        if knee > 0 and x > knee:
            slope = self.decode_e1_ms + 2 * self.decode_e2_ms * knee
            value = poly(knee) + slope * (x - knee)
        else:
            value = poly(x)
        return max(self.decode_min_ms, value)

    @classmethod
    def from_fields(
        cls, raw: Mapping[str, Any], label: str, *, max_running_requests: int = 256, kv_capacity_tokens: int = 0
    ) -> EngineProfile:
        """The profile from a timing profile's fields (the simworker's format; the shell reads the file).
        `kv_capacity_tokens` > 0 replaces the profile's. Raises ConfigError("timing_profile", label, why)."""
        missing = [f for f in _PROFILE_FIELDS if f not in raw]
        if missing:
            raise ConfigError("timing_profile", label, f"missing fields: {', '.join(missing)}")
        if raw["decode_x"] not in ("context_k", "kv_utilisation"):
            raise ConfigError("timing_profile", label, "decode_x must be context_k or kv_utilisation")
        try:
            return cls(
                name=str(raw.get("name", label)),
                decode_x=raw["decode_x"],
                **{f: float(raw[f]) for f in _PROFILE_FIELDS[1:-1]},
                kv_capacity_tokens=int(kv_capacity_tokens or raw["kv_capacity_tokens"]),
                max_running_requests=max_running_requests,
                model=str(raw.get("model", "")),
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError("timing_profile", label, f"bad field value: {exc}") from None

    def check_model(self, worker_model: str) -> None:
        """Refuse a profile measured for another model than the workers serve: its engine rps (the safe
        rate per replica, throughput scaling) would describe someone else's engine. `worker_model` ""
        checks nothing. Raises ConfigError("worker_model", worker_model, why)."""
        if not worker_model or self.model == worker_model:
            return
        said = f"is for {self.model}" if self.model else 'names no model (add a "model" field to it)'
        raise ConfigError(
            "worker_model",
            worker_model,
            f"the timing profile {self.name} {said}: give the profile of the served model (--timing-profile)",
        )

    def prefill_ms(self, isl: int) -> float:
        return (
            self.prefill_step_base_ms
            + self.prefill_ms_per_token * isl
            + self.prefill_attn_ms_per_token2 * isl * isl / 2
        )


@dataclass(frozen=True)
class EngineRate:
    rps: float
    batch: int
    itl_ms: float


def engine_rps(profile: EngineProfile, isl: int, osl: int, itl_sla_ms: float) -> EngineRate:
    """The best request rate of one replica meeting the ITL SLA (rps 0 when none does)."""
    if isl < 0 or osl < 1 or not itl_sla_ms > 0:
        raise ValueError("isl >= 0, osl >= 1 and itl_sla_ms > 0 are required")
    per_request_tokens = isl + osl
    max_batch = min(profile.max_running_requests, max(1, profile.kv_capacity_tokens // max(1, per_request_tokens)))
    p_s = profile.prefill_ms(isl) / 1000.0
    best = EngineRate(0.0, 0, math.inf)
    for batch in range(1, max_batch + 1):
        context = batch * (isl + osl / 2)
        x = context / 1000.0 if profile.decode_x == "context_k" else context / max(1, profile.kv_capacity_tokens)
        d_s = profile.decode_ms(x) / 1000.0
        rps = batch / (osl * d_s + p_s)
        busy = rps * p_s
        if busy >= 1:
            continue
        itl_ms = d_s / (1 - busy) * 1000.0
        if itl_ms <= itl_sla_ms and rps > best.rps:
            best = EngineRate(rps, batch, itl_ms)
    return best
