"""Thrash: multi-turn conversations whose contexts total 3x the KV pool, with tool pauses between
turns, lose their prefixes and recompute them; the same turns with room hit ~100% after turn 1."""

from __future__ import annotations

from bench.replay import Program, Turn, replay_closed_loop
from services.simworker.core.api import EngineConfig
from services.simworker.core.engine import SimEngine
from services.simworker.profiles import load_profile

PAGE = 16
CONVERSATIONS = 24
FIRST_PROMPT = 1_600
NEW_PER_TURN = 300
OUTPUT = 40
TURNS = 6
PAUSE_S = 3.0


def conversations() -> list[Program]:
    programs = []
    for c in range(CONVERSATIONS):
        turns, size = [], FIRST_PROMPT
        for _ in range(TURNS):
            turns.append(Turn(size, OUTPUT, PAUSE_S))
            size += OUTPUT + NEW_PER_TURN
        programs.append(Program(f"conv{c}", tuple(turns)))
    return programs


def final_context_total(programs) -> int:
    return sum(p.turns[-1].input_tokens + p.turns[-1].output_tokens for p in programs)


def run(pool_tokens: int):
    engine = SimEngine(
        EngineConfig(max_total_tokens=pool_tokens, page_size=PAGE, context_length=65_536),
        load_profile("glm45-fp8-h200"),
    )
    samples = []
    original_step = engine.step

    def step(now):  # sample the counter as the run goes
        result = original_step(now)
        samples.append(engine.stats().recomputed_tokens_total)
        return result

    engine.step = step
    records = replay_closed_loop(engine, conversations(), concurrency=CONVERSATIONS)
    return engine, records, samples


def prefix_reuse(records) -> float:
    """Cached / reusable tokens over turns after the first (reusable = previous prompt + its output,
    whole pages, at most one token short of this prompt)."""
    by_program: dict[str, list] = {}
    for r in records:
        by_program.setdefault(r.program_id, []).append(r)
    cached = reusable = 0
    for calls in by_program.values():
        calls.sort(key=lambda r: r.turn)
        for prev, cur in zip(calls, calls[1:]):
            possible = min(prev.input_tokens + prev.output_tokens - 1, cur.input_tokens - 1) // PAGE * PAGE
            reusable += possible
            cached += min(cur.cached_tokens, possible)
    return cached / reusable


def test_contexts_are_three_times_the_pool():
    total = final_context_total(conversations())
    assert 2.9 <= total / (total // 3) <= 3.1


def test_thrash_recomputes_and_hit_rate_falls_while_roomy_hits_everything():
    total = final_context_total(conversations())
    tight_engine, tight_records, tight_samples = run(pool_tokens=total // 3 // PAGE * PAGE)
    roomy_engine, roomy_records, roomy_samples = run(pool_tokens=2 * total)

    roomy, tight = roomy_engine.stats(), tight_engine.stats()
    assert roomy.recomputed_tokens_total == 0
    assert roomy.evicted_tokens_total == 0
    assert prefix_reuse(roomy_records) >= 0.99

    assert tight.recomputed_tokens_total > total // 2
    assert tight.evicted_tokens_total > 0
    assert prefix_reuse(tight_records) < 0.6
    assert tight.cached_tokens_total / tight.prompt_tokens_total < 0.8 * (
        roomy.cached_tokens_total / roomy.prompt_tokens_total
    )
    # The counter rises through the run, not in one burst at the start.
    quarter = len(tight_samples) // 4
    assert 0 < tight_samples[quarter] < tight_samples[2 * quarter] < tight_samples[-1]
    # Thrash costs time: the same work takes longer.
    assert max(r.last_token_s for r in tight_records) > max(r.last_token_s for r in roomy_records)
