"""Per-program weights in the working set (thunderagent.md §2.2).

Let T = token_total, w_a = acting_token_weight, tau = acting_decay_tau_seconds,
idle = max(0, now - acting_since), B = buffer_per_program_tokens.

    raw (pause side):      w(p)   = T                      if REASONING
                           w(p)   = floor(T * w_a)         if ACTING
    decayed (resume side): w_d(p) = T                      if REASONING
                           w_d(p) = floor(T * 2^(-idle/tau)) if ACTING

A replica's working set adds B per program: used(r) = sum(w(p) + B), used_d(r) = sum(w_d(p) + B).
"""

from __future__ import annotations

import math

from services.scheduler.core.model import Program, Status


def raw_weight_tokens(program: Program, acting_token_weight: float) -> int:
    if program.status is Status.ACTING:
        return math.floor(program.token_total * acting_token_weight)
    return program.token_total


def decayed_weight_tokens(program: Program, now: float, acting_decay_tau_seconds: float) -> int:
    if program.status is not Status.ACTING:
        return program.token_total
    since = program.acting_since
    idle_s = 0.0 if since is None else max(0.0, now - since)
    return math.floor(program.token_total * 2.0 ** (-idle_s / acting_decay_tau_seconds))
