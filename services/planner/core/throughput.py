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
