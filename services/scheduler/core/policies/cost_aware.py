"""The cost-aware pause policy ("cost_aware"): hold an idle context only when holding is cheaper
than recomputing it.

Formula. For an ACTING program p with T = token_total tokens on a replica whose retention budget
is C tokens, with rho the estimated prefill rate (tokens/s), K the quadratic knee of prefill cost
(tokens), m the estimated mean tool time (s) and sigma = stall_share:

    recompute seconds      r(T)   = T / rho * (1 + T / K)          (linear GEMMs + attention ~ T^2)
    cost of evicting p     E(p)   = max(T, sigma * C) * r(T)       (KV token-seconds that stall meanwhile)
    cost of holding p      H(p)   = T * m                          (its KV through the rest of the tool;
                                                                    memoryless tools: E[rest] = m)
    hold fraction          phi(p) = min(1, E(p) / H(p))
    pause-side weight      w(p)   = floor(raw(p) * phi(p))  if phi(p) >= phi_min, else 0

with raw(p) the threshold policy's weight (T if REASONING, floor(T * w_a) if ACTING). REASONING
programs are weighed by phi too (`scale_reasoning`): a context not worth holding is not worth
reserving room for either; its turns queue in the engine, at step granularity, rather than in the
paused queue, at tick granularity. With the defaults (sigma = 1, phi_min = 1) the rule is binary
and reads: hold a context iff recomputing it would take at least as long as its share of the
pool times the tool call it waits through, r(T) >= (T / C) * m. sigma = 1 because a recompute's
prefill chunks share the engine's steps with every decoding request, so the whole batch waits
through it; with sigma = 0 (only the program's own KV waits) the rule is r(T) >= m. So a
program whose recompute is expensive relative to the KV-time it would hold (long context, short
tool, big pool) counts fully and gets the reference treatment; a cheap one (short context, long
tool, small pool) counts little or nothing, and the engine may evict it, as plain KV-aware
routing would. The weight enters the pause band, admission and the resume guard through the
core's working set, so with phi = 1 everywhere this policy is the threshold policy.

Pause plan: the threshold plan (ACTING shortest-first down to target, then just enough REASONING
marks) over the programs that count; an ACTING program with w(p) = 0 is already let go and is
never paused (pausing it would free only the buffer and leave its next turn waiting).

Cost. E/H = max(T, sigma * C) * (1 + T / K) / (rho * m) grows with T, so under the binary rule
the programs held on a budget are those from one size up: the policy finds that size per budget
(by bisection with the formula itself) once per change of the estimates, and a weight is then one
comparison. A refresh that moves no budget's threshold changes no weight and says so, and the core
re-weighs nothing.

Estimates (learnt online, folded in by `refresh` once per tick so that weights stay constant
between ticks and the core's incremental accounting stays exact):

    m   = (n0 * m0 + sum of decayed tool times) / (n0 + decayed count)
    rho = the 97th percentile of {n0 copies of rho0} + the last 256 rates u * (1 + u / K) / ttft

with tool times observed between a Complete and the program's next Admit, and (u, ttft) the
uncached prompt tokens and time to first token of a turn (only when the caller reports ttft).
A turn's ttft is its prefill plus however long it queued in the engine, so every observed rate is
at most the engine's real prefill rate, and under load most are far below it; a mean of them
would read queueing as slow prefill and hold contexts that are cheap to recompute (exactly when
the engine is busiest). The upper quantile of recent rates estimates the unqueued rate; it is not
the maximum, so that a turn whose cached-token count was under-reported cannot set it alone.

Workers without cache reports (SGLang without --enable-cache-report) send no cached-token count,
so every (u, ttft) of theirs takes the whole prompt as uncached: an agent's turn is mostly cached
context, so its rate reads many times too fast, recompute looks cheap, and the policy holds
nothing (measured live: 44% of prompt tokens cached instead of 81%). Their turns are therefore not
observed at all (the core asks `cache_reported(replica)` from the capacity snapshot's
degradations before `observe_prefill`), and rho is learnt from the workers that do report, or
stays at rho0 when none does. The alternatives are worse: the same quantile over samples biased
upwards by an unknown cached share has no correction to apply; a lower quantile would mix that
bias with queueing, which biases the other way; and a guess of the cached share from the
scheduler's own table cannot see what the engine evicted. rho0 (--cost-aware-prefill-tokens-per-s,
scaled by the workers' speedup for simulated ones) is the engine's documented rate, so a fleet
without cache reports gets the decisions the prior gives, which is what the capacity service's
warning tells the operator to fix or to set. Tool
observations decay by 2^(-1/half_life) each, and n0 = prior_observations pseudo-observations of
the static defaults (m0, rho0) keep the estimates sensible before any observation.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Callable

from services.scheduler.core.calibration import DecayedRatio
from services.scheduler.core.model import Program, Status, nearest_rank
from services.scheduler.core.policies.base import PauseContext, PausePlan
from services.scheduler.core.policies.params import CostAwarePauseParams, ThresholdPauseParams
from services.scheduler.core.policies.threshold import ThresholdPausePolicy

# Smallest uncached prompt whose time to first token says something about the prefill rate.
MIN_PREFILL_SAMPLE_TOKENS = 256
# Recent prefill-rate samples kept, and the quantile of them taken as the engine's unqueued rate.
PREFILL_WINDOW = 256
PREFILL_QUANTILE = 0.97
_MEMO_ENTRIES = 1 << 16  # hold fractions remembered per (size, budget) before the memo starts over
# The binary rule's threshold search (see `_smallest_held`) relies on E/H growing by a relative
# 1/(K + T) or more per token, far above float rounding for any K up to this; beyond, each size is
# asked.
_THRESHOLD_MAX_QUADRATIC_TOKENS = 1e12
_NEVER_HELD = 1 << 62
_BUDGETS_KEPT = 1024  # budgets whose threshold a refresh compares before it reports "may have changed"


class CostAwarePausePolicy:
    name = "cost_aware"

    def __init__(self, params: CostAwarePauseParams) -> None:
        self.params = params
        self._threshold = ThresholdPausePolicy(ThresholdPauseParams(params.mark_all_reasoning))
        # Decayed mean tool time with n0 pseudo-observations of m0 (folded in by the next refresh).
        self._tool = DecayedRatio(
            params.prior_observations * params.tool_seconds, params.prior_observations, params.half_life_observations
        )
        self._prefill_rates: deque[float] = deque(maxlen=PREFILL_WINDOW)
        self._pending = False
        self.tool_seconds = params.tool_seconds
        self.prefill_tokens_per_s = params.prefill_tokens_per_s
        self._memo: dict[tuple[int, int], float] = {}
        self._memo_estimates = (self.tool_seconds, self.prefill_tokens_per_s)
        # The binary rule (phi_min = 1): the smallest size held per budget, for _memo_estimates.
        self._binary = params.min_hold_fraction >= 1.0 and params.prefill_quadratic_tokens <= (
            _THRESHOLD_MAX_QUADRATIC_TOKENS
        )
        self._held_from: dict[int, int] = {}
        # Every budget weighed under the binary rule (the charges on it depend on its threshold).
        self._budgets: dict[int, int] = {}  # -> its last threshold (where the next search starts)

    # -- observations (any time) and estimates (folded in once per tick) ---------------------------

    def observe_tool(self, seconds: float) -> None:
        """A program's tool call lasted `seconds` (Complete -> its next Admit)."""
        if seconds >= 0 and math.isfinite(seconds):
            self._tool.observe(seconds, 1.0)
            self._pending = True

    def observe_prefill(self, uncached_tokens: int, ttft_s: float) -> None:
        """A turn prefilled `uncached_tokens` and showed its first token `ttft_s` after dispatch."""
        if uncached_tokens >= MIN_PREFILL_SAMPLE_TOKENS and ttft_s > 0 and math.isfinite(ttft_s):
            u = float(uncached_tokens)
            self._prefill_rates.append(u * (1.0 + u / self.params.prefill_quadratic_tokens) / ttft_s)
            self._pending = True

    def refresh(self) -> bool:
        """Fold the observations into the estimates; True if the weights may have changed. Under the
        binary rule a weight changes only with the threshold of its budget: False when the estimates
        moved every threshold weighed so far by less than a token (the core then re-weighs nothing)."""
        if not self._pending:
            return False
        self._pending = False
        before = self._hold_thresholds() if self._binary and len(self._budgets) <= _BUDGETS_KEPT else None
        self._fold()
        if before is None:
            self._budgets.clear()  # the core re-weighs every charge, which records its budget again
            return True
        return self._hold_thresholds() != before

    def _hold_thresholds(self) -> dict[int, int]:
        return {budget: self._hold_threshold(budget) for budget in self._budgets}

    def _fold(self) -> None:
        p = self.params
        n0 = p.prior_observations
        self.tool_seconds = self._tool.value
        if self._prefill_rates:
            samples = sorted([p.prefill_tokens_per_s] * round(n0) + list(self._prefill_rates))
            self.prefill_tokens_per_s = samples[nearest_rank(len(samples), PREFILL_QUANTILE)]

    # -- the formula ------------------------------------------------------------------------------

    def recompute_seconds(self, tokens: int) -> float:
        return tokens / self.prefill_tokens_per_s * (1.0 + tokens / self.params.prefill_quadratic_tokens)

    def hold_fraction(self, tokens: int, capacity_tokens: int) -> float:
        """phi = min(1, E / H): the share of an idle context worth holding."""
        if tokens <= 0:
            return 1.0
        stalled = max(float(tokens), self.params.stall_share * capacity_tokens)
        evict = stalled * self.recompute_seconds(tokens)
        hold = tokens * self.tool_seconds
        return min(1.0, evict / hold)

    def weight_tokens(self, program: Program, raw_tokens: int, capacity_tokens: int) -> int:
        """The pause-side weight of a program whose threshold weight is `raw_tokens`."""
        if program.status is not Status.ACTING and not self.params.scale_reasoning:
            return raw_tokens
        # phi depends on the size, the budget and the estimates only: remembered per (size, budget)
        # for the estimates it was computed with (a tick asks for each placed program's weight a few
        # times, and every placed program's after a refresh).
        self._sync_memo(bounded=True)
        if self._binary:
            # Under the binary rule the weight is raw (phi = 1) or 0, and phi >= 1 holds exactly for the
            # sizes from a threshold up: one comparison instead of a phi per size.
            held_from = self._held_from.get(capacity_tokens)
            if held_from is None:
                held_from = self._hold_threshold(capacity_tokens)
            return raw_tokens if program.token_total >= held_from else 0
        key = (program.token_total, capacity_tokens)
        phi = self._memo.get(key)
        if phi is None:
            phi = self._memo[key] = self.hold_fraction(program.token_total, capacity_tokens)
        return math.floor(raw_tokens * phi) if phi >= self.params.min_hold_fraction else 0

    def weigher(self, capacity_tokens: int) -> Callable[[Program, int], int] | None:
        """`weight_tokens` on one budget, for the estimates as they are now (they move only in
        `refresh`): a plan that weighs hundreds of programs on one budget asks for it once. Under the
        binary rule it is the one comparison with the budget's threshold size, with none of the
        per-call checks, and None when that threshold is 1: every context counts, at its raw weight
        (a size 0 weighs 0 either way)."""
        self._sync_memo(bounded=True)
        if not self._binary:
            return lambda program, raw_tokens: self.weight_tokens(program, raw_tokens, capacity_tokens)
        held_from = self._held_from.get(capacity_tokens)
        if held_from is None:
            held_from = self._hold_threshold(capacity_tokens)
        if held_from <= 1:
            return None
        if self.params.scale_reasoning:
            return lambda program, raw_tokens: raw_tokens if program.token_total >= held_from else 0
        acting = Status.ACTING
        return lambda program, raw_tokens: (
            raw_tokens if program.status is not acting or program.token_total >= held_from else 0
        )

    def _sync_memo(self, bounded: bool = False) -> None:
        """Forget what was remembered for other estimates (`bounded`: or once the memo is full)."""
        estimates = (self.tool_seconds, self.prefill_tokens_per_s)
        if estimates != self._memo_estimates or (bounded and len(self._memo) >= _MEMO_ENTRIES):
            self._memo.clear()
            self._held_from.clear()
            self._memo_estimates = estimates

    def _hold_threshold(self, capacity_tokens: int) -> int:
        """The binary rule's smallest size held on a budget, for the current estimates (remembered)."""
        self._sync_memo()
        held_from = self._held_from.get(capacity_tokens)
        if held_from is None:
            # From the budget's last threshold: the estimates move it a little per refresh.
            near = self._budgets.get(capacity_tokens) or 1
            held_from = self._held_from[capacity_tokens] = self._smallest_held(capacity_tokens, near)
            self._budgets[capacity_tokens] = held_from
        return held_from

    def _smallest_held(self, capacity_tokens: int, near: int = 1) -> int:
        """The smallest size T >= 1 with hold_fraction(T, C) >= phi_min (binary rule; _NEVER_HELD if
        none below it). E/H = max(T, sigma * C) * (1 + T/K) / (rho * m) grows with T by a relative
        1/(K + T) or more per token, and the float evaluation of `hold_fraction` errs by a few units in
        the last place (1e-15 relative): so `hold_fraction(T) >= phi_min` is false below one size and
        true from it on, and bisection with `hold_fraction` itself finds exactly that size. (Size 0
        weighs 0 either way.)"""
        phi_min = self.params.min_hold_fraction

        def held(tokens: int) -> bool:
            return self.hold_fraction(tokens, capacity_tokens) >= phi_min

        # Gallop from `near` to a bracket: held(low) false (0: a sentinel), held(high) true.
        near = min(max(1, near), _NEVER_HELD - 1)
        step = 1
        if held(near):
            low, high = 0, near
            while high - step >= 1:
                if not held(high - step):
                    low = high - step
                    break
                high, step = high - step, step * 2
        else:
            low = near
            while True:
                if low + step >= _NEVER_HELD:
                    return _NEVER_HELD
                if held(low + step):
                    high = low + step
                    break
                low, step = low + step, step * 2
        while high - low > 1:
            middle = (low + high) // 2
            if held(middle):
                high = middle
            else:
                low = middle
        return high

    def plan(self, ctx: PauseContext) -> PausePlan:
        # The threshold plan over the programs that count (an ACTING program of weight 0 is already
        # let go), which passes over the weightless ones where it reaches them instead of weighing
        # every resident up front.
        return self._threshold.plan_counting(ctx, skip_weightless=True)


def make_cost_aware_policy(params: CostAwarePauseParams | None = None) -> CostAwarePausePolicy:
    return CostAwarePausePolicy(params or CostAwarePauseParams())
