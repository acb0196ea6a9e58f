"""Closed-loop replay of agent programs through the simworker engine core, in virtual time (pure).

A bench harness (it drives `services.simworker.core` from outside, as the fidelity test and
`bench.simworker_core` do), so it lives in `bench/`, not in the product's core.

Each of `concurrency` workers runs one program at a time, as SWE-agent's `num_workers` did:
container setup (`env_prepare_seconds`), then per turn an LLM call whose prompt has exactly
`input_tokens` tokens and extends the previous prompt plus the previous call's generated ids
(so the prefix cache behaves as in the real run), generating exactly `output_tokens`, then
`tool_seconds_after` of tool time before the next call. When a program ends, the worker
starts the next one from the queue.

A call starts at `call_start_s`; it reaches the engine `frontend_s(prompt)` later (the client,
HTTP and tokenization latency that the measured TTFT of TIMING.md includes; pass a function
returning 0 for server-side times). Its TTFT is first token − call start; the decode window
is last token − first token, i.e. (tokens − 1) inter-token intervals.
"""

from __future__ import annotations

import heapq
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

from services.simworker.core.api import EngineRequest
from services.simworker.core.engine import SimEngine
from services.simworker.core.tokenizer import HASH_ID_BASE, HASH_VOCAB


@dataclass(frozen=True)
class Turn:
    input_tokens: int
    output_tokens: int
    tool_seconds_after: float


@dataclass(frozen=True)
class Program:
    program_id: str
    turns: tuple[Turn, ...]
    env_prepare_s: float = 0.0
    run_concurrency: int = 0


@dataclass
class CallRecord:
    program_id: str
    turn: int
    input_tokens: int
    output_tokens: int
    call_start_s: float
    first_token_s: float | None = None
    last_token_s: float | None = None
    cached_tokens: int = 0
    retractions: int = 0

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.call_start_s

    @property
    def itl_s(self) -> float | None:
        if self.output_tokens < 2:
            return None
        return (self.last_token_s - self.first_token_s) / (self.output_tokens - 1)


def load_trace(path: str | Path) -> list[Program]:
    """Programs of a swe_agent_trace.jsonl-shaped file."""
    programs = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        turns = tuple(
            Turn(int(t["input_tokens"]), max(1, int(t["output_tokens"])), float(t["tool_seconds_after"]))
            for t in row["turns"]
        )
        programs.append(
            Program(
                row["program_id"], turns, float(row.get("env_prepare_seconds", 0.0)), int(row.get("run_concurrency", 0))
            )
        )
    return programs


@dataclass
class _Running:
    program: Program
    instance: int
    rng: random.Random
    turn: int = 0
    tokens: list[int] = field(default_factory=list)
    record: CallRecord | None = None


def replay_closed_loop(
    engine: SimEngine,
    programs: Sequence[Program],
    concurrency: int,
    frontend_s: Callable[[int], float] | None = None,
    seed: int = 0,
    reuse_output_tokens: bool = True,
    max_steps: int = 50_000_000,
) -> list[CallRecord]:
    """Run `programs` through `engine` with `concurrency` workers; returns one record per call.

    `reuse_output_tokens=False` models a client whose chat template re-renders the previous
    answer differently from the generated ids, so that answer is prefilled again next turn.
    """
    frontend = frontend_s or engine.profile.frontend_s
    queue = list(enumerate(programs))
    queue.reverse()
    arrivals: list[tuple[float, int, _Running]] = []  # (time at the engine, tie-break, program)
    in_flight: dict[str, _Running] = {}
    records: list[CallRecord] = []
    tie = 0

    def start_call(state: _Running, start_s: float) -> None:
        nonlocal tie
        turn = state.program.turns[state.turn]
        tokens = state.tokens
        if len(tokens) < turn.input_tokens:
            rand = state.rng.randrange
            tokens.extend(HASH_ID_BASE + rand(HASH_VOCAB) for _ in range(turn.input_tokens - len(tokens)))
        else:
            del tokens[turn.input_tokens :]
        state.record = CallRecord(state.program.program_id, state.turn, turn.input_tokens, turn.output_tokens, start_s)
        tie += 1
        heapq.heappush(arrivals, (start_s + frontend(turn.input_tokens), tie, state))

    def start_next_program(now: float) -> None:
        if not queue:
            return
        instance, program = queue.pop()
        state = _Running(program, instance, random.Random(f"{seed}:{instance}:{program.program_id}"))
        start_call(state, now + program.env_prepare_s)

    def submit_due(until: float) -> None:
        while arrivals and arrivals[0][0] <= until:
            at, _, state = heapq.heappop(arrivals)
            rid = f"{state.instance}:{state.turn}"
            turn = state.program.turns[state.turn]
            in_flight[rid] = state
            engine.submit(EngineRequest(rid, tuple(state.tokens), turn.output_tokens, ignore_eos=True), at)

    for _ in range(min(concurrency, len(queue))):
        start_next_program(0.0)
    now = 0.0
    for _ in range(max_steps):
        if not engine.has_work():
            if not arrivals:
                return records
            now = max(now, arrivals[0][0])
            submit_due(now)
            continue
        result = engine.step(now)
        now += result.duration_s
        for out in result.outputs:
            state = in_flight[out.rid]
            record = state.record
            if out.new_token_ids:
                if record.first_token_s is None:
                    record.first_token_s = now
                record.last_token_s = now
                if reuse_output_tokens:
                    state.tokens.extend(out.new_token_ids)
            if out.finished:
                del in_flight[out.rid]
                record.cached_tokens = out.cached_tokens
                record.retractions = out.num_retractions
                records.append(record)
                turn = state.program.turns[state.turn]
                state.turn += 1
                if state.turn < len(state.program.turns):
                    start_call(state, now + turn.tool_seconds_after)
                else:
                    start_next_program(now)
        submit_due(now)
    raise RuntimeError("replay did not finish within max_steps")


def median(values: Iterable[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        raise ValueError("median of nothing")
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
