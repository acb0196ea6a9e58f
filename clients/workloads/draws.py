"""Which programs of a trace a run plays: the held-out split, and stratified or random draws.

**The split** (the single definition; docs/benchmarks/agentic.md "Held-out split"): a program is
held out iff `int(sha256(program_id).hexdigest(), 16) % 3 == 0`. It depends on the program's id
only, so it is fixed for a trace and needs no list. On the shipped trace 21 of the 66 programs are
held out (the 138-turn program among them) and 45 are for tuning. Tuning, and every default run of
bench.sim, bench.compare and bench.evaluate, draws from the tuning part; the held-out part is
evaluated and reported separately and never used to choose settings.

**Draws**: `stratified` (the default) takes the source's size mix at any count; `random` samples
uniformly with replacement. Either can be forced to include the source's longest program (most
turns), so that a set of draws sees the worst case.
"""

from __future__ import annotations

import hashlib
import random
from typing import Sequence

from clients.workloads.model import Program
from services.common.settings.config import require

SPLITS = ("tune", "heldout", "all")
DEFAULT_SPLIT = "tune"
DRAWS = ("stratified", "random")
DEFAULT_DRAW = "stratified"
HELD_OUT_MODULUS = 3
"""One program in three (by id hash) is held out."""


def is_held_out(program_id: str) -> bool:
    return int(hashlib.sha256(program_id.encode()).hexdigest(), 16) % HELD_OUT_MODULUS == 0


def split_programs(programs: Sequence[Program], part: str) -> list[Program]:
    """The `part` of `programs`: "tune" (not held out), "heldout" or "all", in their order."""
    require(part in SPLITS, "split", part, f"split in {{{', '.join(SPLITS)}}}")
    if part == "all":
        return list(programs)
    held = part == "heldout"
    return [p for p in programs if is_held_out(p.program_id) == held]


def program_work_tokens(program: Program) -> int:
    """Prompt plus output tokens over all turns: what the engines process with no cache at all."""
    return sum(t.input_tokens + t.output_tokens for t in program.turns)


def longest_program(source: Sequence[Program]) -> Program:
    """The program with the most turns (ties: the most work, then the id): the one that sets a
    makespan when everything starts together."""
    require(len(source) >= 1, "source", len(source), "at least one program")
    return max(source, key=lambda p: (len(p.turns), program_work_tokens(p), p.program_id))


def stratified_programs(source: Sequence[Program], count: int, *, seed: int) -> list[Program]:
    """`count` programs with the same size mix as `source` whatever `count` is.

    Whole copies of `source`, then for the remainder the programs at evenly spaced ranks of peak
    context (rank floor((i + 1/2) * n / r)), so that a sweep's small and large points see the same
    distribution of program sizes rather than the trace's first programs at one point and its
    largest at another; shuffled with `seed` so that with fewer slots than programs the large ones
    do not all start last."""
    ordered = sorted(source, key=lambda p: (p.peak_context_tokens, p.program_id))
    n = len(ordered)
    whole, rest = divmod(count, n)
    chosen = ordered * whole + [ordered[int((i + 0.5) * n / rest)] for i in range(rest)]
    random.Random(f"workload:{seed}").shuffle(chosen)
    return chosen


def random_programs(source: Sequence[Program], count: int, *, seed: int) -> list[Program]:
    """`count` programs sampled uniformly with replacement from `source` (seeded)."""
    rng = random.Random(f"draw:{seed}")
    return [rng.choice(source) for _ in range(count)]


def draw_programs(
    source: Sequence[Program], count: int, *, draw: str = DEFAULT_DRAW, seed: int = 0, include_longest: bool = False
) -> list[Program]:
    """`count` programs of `source` by `draw`. With `include_longest`, a draw that lacks the
    longest program gets it in place of one program at a seeded position (so in a steady-state run
    it does not always start first)."""
    require(draw in DRAWS, "draw", draw, f"draw in {{{', '.join(DRAWS)}}}")
    require(count >= 1, "programs", count, "programs >= 1")
    require(len(source) >= 1, "source", len(source), "at least one program to draw from")
    chosen = (random_programs if draw == "random" else stratified_programs)(source, count, seed=seed)
    if include_longest:
        longest = longest_program(source)
        if all(p.program_id != longest.program_id for p in chosen):
            chosen[random.Random(f"longest:{seed}").randrange(count)] = longest
    return chosen
