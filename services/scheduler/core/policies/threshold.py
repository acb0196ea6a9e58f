"""The reference pause policy ("threshold", the default).

Formula (thunderagent.md §3.6, anchors.md §1): with used(r) the raw working set and
target = capacity(r) * pause_target,

1. pause ACTIVE+ACTING programs in ascending raw token_total (ties: creation order), skipping
   marked ones, while used(r) > target; each pause frees w(p) + B;
2. if still used(r) > target (or, with a request-count limit, reasoning_count > count_target),
   mark ACTIVE+REASONING programs in ascending token_total until the projected working set
   (already-marked programs counted as freed) is within target.

Shortest first because the recompute cost of an evicted context grows with the square of its
length (the paper's Lemma 4.1): freeing a given number of tokens from short programs costs least.
`mark_all_reasoning=True` reproduces the upstream behaviour of marking every REASONING program.
"""

from __future__ import annotations

from operator import attrgetter

from services.scheduler.core.model import Status
from services.scheduler.core.policies.base import PauseContext, PausePlan
from services.scheduler.core.policies.params import ThresholdPauseParams

# Smallest first, then the oldest: `PauseContext.programs` come in creation order and the sort is
# stable, so sorting on the size alone keeps ties oldest first (an int key, no tuple per program).
_SIZE = attrgetter("token_total")


class ThresholdPausePolicy:
    name = "threshold"

    def __init__(self, params: ThresholdPauseParams) -> None:
        self.params = params

    def plan(self, ctx: PauseContext) -> PausePlan:
        return self.plan_counting(ctx, skip_weightless=False)

    def plan_counting(self, ctx: PauseContext, *, skip_weightless: bool) -> PausePlan:
        """The plan; with `skip_weightless`, over the programs that count only: an ACTING program
        of weight 0 is passed over as if it were not on the replica. It is skipped where the pause
        loop reaches it, so that only the programs the loop gets to are weighed (the loop stops at
        the target, after a few of the hundreds of residents); skipping it frees nothing, so the
        plan is the one over the programs that count."""
        used = ctx.used_tokens
        acting_status = Status.ACTING
        acting = [p for p in ctx.programs if p.status is acting_status]
        acting.sort(key=_SIZE)
        pause: list[str] = []
        weight, buffer = ctx.weight_tokens, ctx.buffer_tokens
        for program in acting:
            if used <= ctx.target_tokens:
                break
            if program.marked:
                continue
            tokens = weight(program)
            if skip_weightless and tokens <= 0:
                continue
            pause.append(program.session_id)
            used -= tokens + buffer

        reasoning = [p for p in ctx.programs if p.status is not acting_status]
        # Programs already marked will leave at their next boundary: count them as freed.
        count = ctx.reasoning_count
        for program in reasoning:
            if program.marked:
                used -= ctx.weight_tokens(program) + ctx.buffer_tokens
                count -= 1

        def over() -> bool:
            return used > ctx.target_tokens or (ctx.count_target is not None and count > ctx.count_target)

        mark: list[str] = []
        if over():
            for program in sorted(reasoning, key=_SIZE):
                if program.marked:
                    continue
                if not self.params.mark_all_reasoning and not over():
                    break
                mark.append(program.session_id)
                used -= ctx.weight_tokens(program) + ctx.buffer_tokens
                count -= 1
        return PausePlan(pause=tuple(pause), mark=tuple(mark))


def make_threshold_policy(params: ThresholdPauseParams | None = None) -> ThresholdPausePolicy:
    return ThresholdPausePolicy(params or ThresholdPauseParams())
