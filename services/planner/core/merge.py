"""Type-aware merge of replica opinions, stage by stage, keeping provenance (reference §4).

Per stage, over the opinions of that stage:

    any REJECT                 -> the whole merge short-circuits (no scaling this tick)
    floor    = max(AT_LEAST)   (default 0)
    ceiling  = min(AT_MOST)    (default +inf)
    proposal = the SET with the smallest priority number, else the stage's baseline
    result   = max(floor, min(ceiling, proposal))          (a floor wins a conflict)

Stages chain: PROPOSE starts from the baseline (the current desired count), RECONCILE from
PROPOSE's result, CONSTRAIN from RECONCILE's. CONSTRAIN may not SET: its SETs are dropped and
audited. Every step that changed the number is recorded as a `MergeStep` naming its source.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from services.planner.core.types import Opinion, Stage, TargetKind


@dataclass(frozen=True)
class MergeStep:
    stage: Stage
    source: str
    kind: TargetKind
    value: int | None
    reason: str
    effect: str
    """"set", "raised_to_floor", "capped_to_ceiling", "set_dropped" or "rejected"."""


@dataclass(frozen=True)
class MergeOutcome:
    replicas: int | None
    """The merged target (None = nobody had an opinion and the baseline is unknown)."""
    action: str
    """"apply", "skip_no_targets" (no opinion at all) or "skip_short_circuit" (a REJECT)."""
    steps: tuple[MergeStep, ...]
    stage_results: dict
    reject_reason: str = ""
    proposed: bool = False
    """Some PROPOSE source evaluated this tick (not a replay) gave a SET or bound."""


def _stage(opinions: list[Opinion], stage: Stage, baseline: int | None) -> tuple[int | None, list[MergeStep]]:
    steps: list[MergeStep] = []
    sets = [o for o in opinions if o.kind is TargetKind.SET]
    if stage is Stage.CONSTRAIN:
        for o in sets:
            steps.append(MergeStep(stage, o.source, o.kind, o.replicas, o.reason, "set_dropped"))
        sets = []
    floors = [o for o in opinions if o.kind is TargetKind.AT_LEAST and o.replicas is not None]
    ceilings = [o for o in opinions if o.kind is TargetKind.AT_MOST and o.replicas is not None]
    value = baseline
    if sets:
        chosen = min(sets, key=lambda o: (o.priority, o.source))
        value = chosen.replicas
        steps.append(MergeStep(stage, chosen.source, chosen.kind, chosen.replicas, chosen.reason, "set"))
    if ceilings:
        ceiling = min(ceilings, key=lambda o: (o.replicas, o.source))
        if value is None or value > ceiling.replicas:  # type: ignore[operator]
            steps.append(
                MergeStep(stage, ceiling.source, ceiling.kind, ceiling.replicas, ceiling.reason, "capped_to_ceiling")
            )
            value = ceiling.replicas
    if floors:
        floor = max(floors, key=lambda o: (o.replicas, o.source))
        if value is None or value < floor.replicas:  # type: ignore[operator]
            steps.append(MergeStep(stage, floor.source, floor.kind, floor.replicas, floor.reason, "raised_to_floor"))
            value = floor.replicas
    return value, steps


def merge(opinions: list[Opinion], baseline: int | None) -> MergeOutcome:
    rejects = [o for o in opinions if o.kind is TargetKind.REJECT]
    if rejects:
        first = min(rejects, key=lambda o: (o.priority, o.source))
        step = MergeStep(first.stage, first.source, first.kind, None, first.reason, "rejected")
        return MergeOutcome(None, "skip_short_circuit", (step,), {}, reject_reason=f"{first.source}: {first.reason}")
    steps: list[MergeStep] = []
    results: dict[str, int | None] = {}
    value = baseline
    for stage in Stage:
        value, stage_steps = _stage([o for o in opinions if o.stage is stage], stage, value)
        steps.extend(stage_steps)
        results[stage.value] = value
    proposed = any(o.stage is Stage.PROPOSE and not o.replayed and o.kind is not TargetKind.REJECT for o in opinions)
    action = "apply" if opinions else "skip_no_targets"
    if value is not None and (not math.isfinite(value) or value < 0):
        value = 0
    return MergeOutcome(value, action, tuple(steps), results, proposed=proposed)
