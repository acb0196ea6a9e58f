"""Control-law parameters of the scheduler core, validated once, and the priority mapping.

Field names are the seed reference's setting names (`pause_threshold`, `resume_timeout_seconds`,
...), so that the flag, the environment variable and the core agree without a translation table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from services.common.settings.errors import ConfigError

# The reference hard-codes a 100-token allowance per program (decode room, bookkeeping slack).
BUFFER_PER_PROGRAM_TOKENS = 100
# The reference clamps tau to this when it is used; we refuse smaller values instead of clamping.
MIN_ACTING_DECAY_TAU_SECONDS = 1e-3
# Soft demotion lasts one and a half ticks so that it survives until the next tick renews it.
SOFT_DEMOTE_WINDOW_TICKS = 1.5
# Released programs needed before tail protection judges a program's age, and how many recent
# releases it remembers (the quantile follows workload drift).
TAIL_MIN_RELEASES = 4
TAIL_WINDOW_RELEASES = 256
# SGLang priority units per "priority second" of the reference (see `to_sglang_priority`).
PRIORITY_UNITS_PER_SECOND = 1.0


def _require(ok: bool, field_name: str, value: object, reason: str) -> None:
    if not ok:
        raise ConfigError(field_name, value, reason)


def _finite(field_name: str, value: float) -> None:
    _require(
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
        field_name,
        value,
        f"{field_name} must be a finite number",
    )


@dataclass(frozen=True)
class ControlParams:
    """The control law (reference: seed-scheduler-reference, thunderagent.md §3, §5)."""

    pause_threshold: float = 0.95
    """Working-set fraction of the retention budget at or above which a pause cycle starts."""
    soft_demote_threshold: float = 0.80
    """Start of the soft-demote band below the pause threshold."""
    pause_target: float = 0.80
    """Setpoint a pause cycle drives utilisation toward."""
    resume_hysteresis: float = 0.10
    """Absolute headroom below pause_threshold required before resuming."""
    pause_margin_quantile: float = 0.0
    """Size a pause cycle's margin from the growth it must absorb (0 disables: the margin is
    pause_threshold - pause_target, the reference). With q > 0 the law measures each replica's
    working-set growth between ticks (as a fraction of its budget) and a pause cycle stops this
    quantile of the recent growth below the pause threshold, never deeper than pause_target: the
    margin is for the resident programs' next turns, and where they grow little a fixed margin
    only makes the resumes that refill it at the next tick (docs/scheduler.md, "The pause margin")."""
    resume_priority_boost: float = 1.0
    """Priority seconds added to a turn that waited in the paused queue (any sign)."""
    resume_timeout_seconds: float = 1800.0
    """Forced-resume cap that bounds how long an admission waits."""
    scheduler_interval_seconds: float = 5.0
    """Tick period; soft demotion lasts 1.5 ticks."""
    soft_demote_priority_jump: float = -2.0
    """Priority seconds applied to a turn of a soft-demoted program (any sign)."""
    acting_token_weight: float = 1.0
    """Multiplier on token_total for ACTING programs in the pause-side working set."""
    acting_decay_tau_seconds: float = 1.0
    """Time constant of the 2^(-idle/tau) decay of ACTING tokens in the resume-side working set."""
    program_idle_ttl_seconds: float = 900.0
    """An ACTING program idle this long is released (0 disables)."""
    resume_aging_seconds: float = 0.0
    """A held admission that has waited this long makes room for itself: ACTING programs on the
    replica it can best use are paused (shortest first) until it fits, then it resumes there
    (0 disables; the reference relies on forced resume after resume_timeout_seconds alone; a value at
    or above resume_timeout_seconds never acts, since forced resume comes first)."""
    soft_pinning: bool = False
    """While every replica is below the soft-demote band and nothing is paused, admissions leave
    the worker to the router ("any") and follow its choice through Bind; under pressure they pin
    as the reference always does (False = always pin, the reference)."""
    tail_protection_quantile: float = 0.0
    """Tail protection (0 disables, the reference): once TAIL_MIN_RELEASES programs have been
    released, a program that has already run more turns than this quantile of the released
    programs' turn counts is a tail program. It is never paused for pressure or to make room for
    an aged admission, and when it waits in the paused queue it resumes first. Agent run lengths
    are heavy-tailed, so the programs that have outlived most others are the ones with the most
    work left: they set a batch's makespan, and every second they spend paused is added to it."""
    resume_wait_discount_seconds: float = 0.0
    """Resume order within each resume group: smallest effective size first, where a paused
    program of T tokens that has waited w seconds counts T / (1 + w / H), so one that waited H
    seconds counts half its size (0 = no discount: smallest T first, the reference, under which a
    large paused program waits while a stream of smaller ones takes the room it needs, until
    resume aging or the forced resume)."""
    calibrate_token_estimates: bool = False
    """Charge a REASONING program the router's prompt estimate scaled by the learnt ratio of the
    prompt tokens workers report to the estimates (core/calibration.py), so that the bands measure
    what the engines hold (False = the estimate as sent, the reference)."""
    buffer_per_program_tokens: int = BUFFER_PER_PROGRAM_TOKENS
    """Per-program allowance added to every program's weight (not a flag, as in the reference)."""

    def __post_init__(self) -> None:
        for name in (
            "pause_threshold",
            "soft_demote_threshold",
            "pause_target",
            "resume_hysteresis",
            "resume_priority_boost",
            "resume_timeout_seconds",
            "scheduler_interval_seconds",
            "soft_demote_priority_jump",
            "acting_token_weight",
            "acting_decay_tau_seconds",
            "program_idle_ttl_seconds",
            "resume_aging_seconds",
            "tail_protection_quantile",
            "resume_wait_discount_seconds",
            "pause_margin_quantile",
        ):
            _finite(name, getattr(self, name))
        p = self.pause_threshold
        _require(0 <= p <= 1, "pause_threshold", p, "0 <= pause_threshold <= 1")
        _require(0 <= self.pause_target <= p, "pause_target", self.pause_target, "0 <= pause_target <= pause_threshold")
        _require(
            0 <= self.resume_hysteresis <= p,
            "resume_hysteresis",
            self.resume_hysteresis,
            "0 <= resume_hysteresis <= pause_threshold",
        )
        _require(
            0 <= self.soft_demote_threshold <= p,
            "soft_demote_threshold",
            self.soft_demote_threshold,
            "0 <= soft_demote_threshold <= pause_threshold",
        )
        _require(
            self.acting_token_weight > 0, "acting_token_weight", self.acting_token_weight, "acting_token_weight > 0"
        )
        _require(
            self.scheduler_interval_seconds > 0,
            "scheduler_interval_seconds",
            self.scheduler_interval_seconds,
            "scheduler_interval_seconds > 0",
        )
        _require(
            self.resume_timeout_seconds > 0,
            "resume_timeout_seconds",
            self.resume_timeout_seconds,
            "resume_timeout_seconds > 0",
        )
        _require(
            self.acting_decay_tau_seconds >= MIN_ACTING_DECAY_TAU_SECONDS,
            "acting_decay_tau_seconds",
            self.acting_decay_tau_seconds,
            "acting_decay_tau_seconds >= 0.001",
        )
        _require(
            self.program_idle_ttl_seconds >= 0,
            "program_idle_ttl_seconds",
            self.program_idle_ttl_seconds,
            "program_idle_ttl_seconds >= 0",
        )
        _require(
            self.resume_aging_seconds >= 0,
            "resume_aging_seconds",
            self.resume_aging_seconds,
            "resume_aging_seconds >= 0",
        )
        _require(
            self.resume_wait_discount_seconds >= 0,
            "resume_wait_discount_seconds",
            self.resume_wait_discount_seconds,
            "resume_wait_discount_seconds >= 0",
        )
        _require(
            0 <= self.tail_protection_quantile < 1,
            "tail_protection_quantile",
            self.tail_protection_quantile,
            "0 <= tail_protection_quantile < 1",
        )
        _require(
            0 <= self.pause_margin_quantile <= 1,
            "pause_margin_quantile",
            self.pause_margin_quantile,
            "0 <= pause_margin_quantile <= 1",
        )
        _require(
            isinstance(self.buffer_per_program_tokens, int) and self.buffer_per_program_tokens >= 0,
            "buffer_per_program_tokens",
            self.buffer_per_program_tokens,
            "buffer_per_program_tokens >= 0",
        )

    @property
    def resume_ceiling(self) -> float:
        """c = max(0, pause_threshold - resume_hysteresis): the resume side fills up to this fraction."""
        return max(0.0, self.pause_threshold - self.resume_hysteresis)

    @property
    def soft_demote_window_seconds(self) -> float:
        return SOFT_DEMOTE_WINDOW_TICKS * self.scheduler_interval_seconds


def to_sglang_priority(priority_seconds: float) -> int:
    """Map the reference's priority seconds to SGLang's integer `priority` (larger runs first).

    priority = round_half_away_from_zero(priority_seconds * PRIORITY_UNITS_PER_SECOND), and a
    non-zero jump never collapses to 0 (it keeps its sign with magnitude >= 1).

    With the defaults: normal turn 0, resumed turn +1, soft-demoted turn -2, both -1. These are
    far below SGLang's default preemption margin (10), so they reorder the waiting queue but never
    preempt running requests.
    """
    scaled = priority_seconds * PRIORITY_UNITS_PER_SECOND
    magnitude = math.floor(abs(scaled) + 0.5)
    if magnitude == 0 and scaled != 0:
        magnitude = 1
    return int(math.copysign(magnitude, scaled)) if magnitude else 0
