"""`bandmaster bench` / `python -m clients.player`: play agent programs against an OpenAI-compatible endpoint.

N programs run in parallel, closed loop: each turn re-sends the whole growing conversation (the
previous prompt, the text the model returned, and a new observation), streams the answer, then the
program waits its tool time before the next turn. With session headers on, every turn carries
`X-Dynamo-Session-ID` and the program ends with a final request (`X-Dynamo-Session-Final: true`).

Time scaling: with simulated workers running `--time-scale` times faster than the hardware they
model, tool times are divided by the same factor and reported durations are multiplied back, so
figures read in the modelled hardware's seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import aiohttp
from opentelemetry import propagate, trace

from clients.progress import ProgressBar
from clients.stats import interpolated_percentile
from clients.workloads import (
    DEFAULT_DRAW,
    DEFAULT_SPLIT,
    DRAWS,
    SPLITS,
    Program,
    draw_programs,
    scale,
    short_context_agents,
    split_programs,
    synthetic_like,
    trace_programs,
)
from services.common.settings.config import require
from services.common.web.session_ids import FINAL_HEADER, SESSION_HEADER

SESSION = SESSION_HEADER
FINAL = FINAL_HEADER
SYSTEM_PROMPT_TOKENS = 400


def text_of_n_tokens(n: int, seed: int) -> str:
    """Text that the simulated workers' tokenizer counts as exactly `n` tokens."""
    from services.simworker.core.tokenizer import text_of_n_tokens as make

    return make(n, seed)


@dataclass
class TurnRecord:
    program_id: str
    turn: int
    ok: bool
    ttft_s: float
    turn_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    error: str = ""


@dataclass
class ProgramRecord:
    program_id: str
    turns_planned: int
    turns_done: int = 0
    errors: int = 0
    duration_s: float = 0.0
    finished: bool = False


@dataclass
class RunResult:
    arm: str
    parallel: int
    wall_s: float
    time_scale: float
    turns: list[TurnRecord] = field(default_factory=list)
    programs: list[ProgramRecord] = field(default_factory=list)
    worker_counters: dict = field(default_factory=dict)

    def summary(self) -> dict:
        ok = [t for t in self.turns if t.ok]
        sim_minutes = self.wall_s * self.time_scale / 60.0
        done = [p for p in self.programs if p.finished]
        prompt = sum(t.prompt_tokens for t in ok)
        cached = sum(t.cached_tokens for t in ok)
        return {
            "arm": self.arm,
            "parallel_programs": self.parallel,
            "programs_done": len(done),
            "programs_total": len(self.programs),
            "turns_ok": len(ok),
            "turns_failed": len(self.turns) - len(ok),
            "wall_s": round(self.wall_s, 3),
            "simulated_minutes": round(sim_minutes, 3),
            "steps_per_min": round(len(ok) / sim_minutes, 3) if sim_minutes > 0 else 0.0,
            "programs_per_min": round(len(done) / sim_minutes, 3) if sim_minutes > 0 else 0.0,
            "program_time_p50_s": _pct([p.duration_s for p in done], 0.5),
            "program_time_p90_s": _pct([p.duration_s for p in done], 0.9),
            "ttft_p50_s": _pct([t.ttft_s for t in ok], 0.5),
            "ttft_p90_s": _pct([t.ttft_s for t in ok], 0.9),
            "kv_hit_rate": round(cached / prompt, 4) if prompt else 0.0,
            **{f"worker_{k}": v for k, v in self.worker_counters.items()},
        }


FAILURE_REASON_CHARS = 160
"""A failed program's reason on the console is cut here: one line each, the whole text is in --out."""


def failure_lines(turns: Sequence[TurnRecord], limit_chars: int = FAILURE_REASON_CHARS) -> list[str]:
    """One line per failed program: its first failed turn and that turn's error, newlines folded and the
    text cut at `limit_chars` (a program stops at its first failed turn, so there is one per program)."""
    first: dict[str, TurnRecord] = {}
    for turn in turns:
        if not turn.ok and turn.program_id not in first:
            first[turn.program_id] = turn
    lines = []
    for turn in first.values():
        reason = " ".join((turn.error or "failed").split())
        if len(reason) > limit_chars:
            reason = reason[: limit_chars - 3] + "..."
        lines.append(f"failed: {turn.program_id} turn {turn.turn}: {reason}")
    return lines


def print_report(report: dict) -> int:
    """The console end of a run: each failed program's reason (stderr), then the summary as JSON (stdout);
    the exit status is 1 when a turn failed."""
    failed = [TurnRecord(**t) for t in report["turns"] if not t["ok"]]
    for line in failure_lines(failed):
        print(line, file=sys.stderr)
    print(json.dumps(report["summary"], indent=1))
    return 0 if report["summary"]["turns_failed"] == 0 else 1


def _pct(values: Sequence[float], q: float) -> float:
    return round(interpolated_percentile(values, q), 4)


class Runner:
    def __init__(
        self,
        endpoint: str,
        model: str,
        *,
        session_headers: bool = True,
        time_scale: float = 1.0,
        request_timeout_s: float = 600.0,
        seed: int = 0,
        arm: str = "endpoint",
        progress: ProgressBar | None = None,
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.model = model
        self.session_headers = session_headers
        self.time_scale = time_scale
        self.timeout = aiohttp.ClientTimeout(total=request_timeout_s, sock_connect=10)
        self.seed = seed
        self.arm = arm
        self.progress = progress
        self.result: RunResult | None = None

    async def run(self, programs: Sequence[Program], parallel: int) -> RunResult:
        result = RunResult(self.arm, parallel, 0.0, self.time_scale)
        self.result = result
        queue: asyncio.Queue[Program] = asyncio.Queue()
        for program in programs:
            queue.put_nowait(program)
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        start = time.monotonic()
        async with aiohttp.ClientSession(connector=connector, timeout=self.timeout) as session:
            # One shared system prompt: agents of one kind share it, which is what prefix routers latch onto.
            system = text_of_n_tokens(SYSTEM_PROMPT_TOKENS, 0)

            async def slot() -> None:
                while not queue.empty():
                    program = queue.get_nowait()
                    record = ProgramRecord(program.program_id, len(program.turns))
                    result.programs.append(record)
                    await self._play(session, program, system, record, result)

            await asyncio.gather(*(slot() for _ in range(max(1, parallel))))
        result.wall_s = time.monotonic() - start
        return result

    async def _play(
        self, session: aiohttp.ClientSession, program: Program, system: str, record: ProgramRecord, result: RunResult
    ) -> None:
        rng = random.Random(f"{self.seed}:{program.program_id}")
        messages: list[dict] = [{"role": "system", "content": system}]
        started = time.monotonic()
        headers = {SESSION: program.program_id} if self.session_headers else {}
        # For the client.turn span: the wall seconds between the previous answer (or the program's start)
        # and this turn's send, and the tool wait among them (bench/breakdown.py: the client's own time).
        since, tool_wait_s = started, 0.0
        for k, turn in enumerate(program.turns):
            new_tokens = max(1, program.new_prompt_tokens(k) - (SYSTEM_PROMPT_TOKENS if k == 0 else 0))
            messages.append({"role": "user", "content": text_of_n_tokens(new_tokens, rng.randrange(1 << 30))})
            between = {"client.program": program.program_id, "client.gap_s": time.monotonic() - since}
            between["client.tool_wait_s"] = tool_wait_s
            rec, text = await self._turn(session, program.program_id, k, messages, turn.output_tokens, headers, between)
            since, tool_wait_s = time.monotonic(), 0.0
            result.turns.append(rec)
            if self.progress is not None:
                self.progress.advance(1)
            if not rec.ok:
                record.errors += 1
                break
            record.turns_done += 1
            messages.append({"role": "assistant", "content": text})
            if turn.tool_seconds_after > 0:
                tool_wait_s = turn.tool_seconds_after / self.time_scale
                await asyncio.sleep(tool_wait_s)
        record.duration_s = (time.monotonic() - started) * self.time_scale
        record.finished = record.turns_done == record.turns_planned
        if self.session_headers:
            await self._final(session, program.program_id)

    async def _turn(
        self,
        session,
        program_id: str,
        k: int,
        messages: list[dict],
        output_tokens: int,
        headers: dict,
        span_attributes: dict | None = None,
    ) -> tuple[TurnRecord, str]:
        body = {
            "model": self.model,
            "messages": messages,
            "max_tokens": output_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0,
            "ignore_eos": True,
        }
        # A CLIENT span per turn, the root of the turn's trace (bench/breakdown.py reads client -> router
        # and router -> client from it). Through the OpenTelemetry API only: a no-op unless the process has
        # a tracer provider (bench.breakdown.client_tracing installs one).
        span = trace.get_tracer("bandmaster.player").start_span(
            "client.turn", kind=trace.SpanKind.CLIENT, attributes={"client.turn": k, **(span_attributes or {})}
        )
        headers = dict(headers)
        propagate.inject(headers, context=trace.set_span_in_context(span))
        t0 = time.monotonic()
        ttft = None
        pieces: list[str] = []
        usage: dict = {}
        error = ""
        try:
            async with session.post(f"{self.endpoint}/chat/completions", json=body, headers=headers) as response:
                if response.status != 200:
                    error = f"HTTP {response.status}: {(await response.text())[:200]}"
                else:
                    async for raw in response.content:
                        if not raw.startswith(b"data: "):
                            continue
                        payload = raw[6:].strip()
                        if payload == b"[DONE]":
                            break
                        chunk = json.loads(payload)
                        if "error" in chunk:
                            error = str(chunk["error"])[:200]
                            break
                        if chunk.get("usage"):
                            usage = chunk["usage"]
                        for choice in chunk.get("choices", ()):
                            delta = choice.get("delta", {}).get("content")
                            if delta:
                                if ttft is None:
                                    ttft = time.monotonic() - t0
                                pieces.append(delta)
                            if choice.get("finish_reason") in ("abort", "error"):
                                error = f"finish_reason={choice['finish_reason']}"
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            error = f"{type(exc).__name__}: {exc}"[:200]
        elapsed = time.monotonic() - t0
        span.end()
        details = usage.get("prompt_tokens_details") or {}
        rec = TurnRecord(
            program_id,
            k,
            ok=not error and ttft is not None,
            ttft_s=round((ttft if ttft is not None else elapsed) * self.time_scale, 4),
            turn_s=round(elapsed * self.time_scale, 4),
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            cached_tokens=int(details.get("cached_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            error=error or ("" if ttft is not None else "no tokens"),
        )
        return rec, "".join(pieces)

    async def _final(self, session, program_id: str) -> None:
        # No messages: the final request only releases the program (one with content would be served as a
        # turn first, and held like any turn while the program is paused).
        body = {"model": self.model, "messages": []}
        try:
            async with session.post(
                f"{self.endpoint}/chat/completions", json=body, headers={SESSION: program_id, FINAL: "true"}
            ) as response:
                await response.read()
        except (aiohttp.ClientError, asyncio.TimeoutError):
            pass  # the scheduler expires programs that never release


COUNTERS = {
    "recomputed_tokens": "simworker:recomputed_tokens_total",
    "retractions": "simworker:retractions_total",
    "preemptions": "simworker:priority_preemptions_total",
    "host_loadback_tokens": "simworker:host_loadback_tokens_total",
    "prompt_tokens": "sglang:prompt_tokens_total",
    "cached_tokens": "sglang:cached_tokens_total",
}


async def scrape_counters(worker_urls: Sequence[str]) -> dict[str, float]:
    """Sum our counters over the workers' /metrics (simworkers; real SGLang lacks the simworker: ones)."""
    totals = {name: 0.0 for name in COUNTERS}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        for url in worker_urls:
            try:
                async with session.get(url.rstrip("/") + "/metrics") as response:
                    text = await response.text()
            except (aiohttp.ClientError, asyncio.TimeoutError):
                continue
            for line in text.splitlines():
                if line.startswith("#"):
                    continue
                for name, metric in COUNTERS.items():
                    if line.startswith(metric):
                        try:
                            totals[name] += float(line.rsplit(" ", 1)[1])
                        except ValueError:
                            pass
    return totals


def build_workload(
    name: str,
    programs: int,
    *,
    seed: int,
    max_turns: int | None,
    token_scale: float,
    tool_time_scale: float,
    trace: str | Path | None = None,
    split: str = DEFAULT_SPLIT,
    draw: str = DEFAULT_DRAW,
    include_longest: bool = False,
) -> list[Program]:
    """The programs of a run, exactly as the live runner and the simulator play them.

    `swe`: `programs` drawn (`draw`, seeded) from the `split` part of `trace` (default: the shipped
    SWE-agent programs), renamed `<id>#<i>` so that repeats are distinct programs. `synthetic`:
    drawn from the same source's distributions. `short`: generated (no trace, no split)."""
    if name == "swe":
        source = split_source(trace, split)
        chosen = draw_programs(source, programs, draw=draw, seed=seed, include_longest=include_longest)
        base = scale(chosen, token_scale=token_scale, tool_time_scale=tool_time_scale, max_turns=max_turns)
        return [Program(f"{p.program_id}#{i}", p.turns, p.run_concurrency) for i, p in enumerate(base)]
    if name == "synthetic":
        base = synthetic_like(programs, seed=seed, source=split_source(trace, split))
    elif name == "short":
        base = short_context_agents(programs, seed=seed)
    else:
        raise SystemExit(f"unknown workload {name!r} (swe, synthetic, short)")
    return scale(base, token_scale=token_scale, tool_time_scale=tool_time_scale, max_turns=max_turns)


def split_source(trace: str | Path | None, split: str) -> list[Program]:
    """The `split` part of `trace` (default: the shipped programs); ConfigError if it is empty."""
    source = split_programs(trace_programs(trace), split)
    require(
        len(source) >= 1,
        "split",
        split,
        f"the {split!r} part of {trace or 'the shipped trace'} holds no programs (try --split all)",
    )
    return source


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoint", required=True, help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default="bandmaster-sim")
    parser.add_argument("--workload", default="swe", choices=("swe", "synthetic", "short"))
    parser.add_argument("--programs", type=int, default=8, help="programs in total")
    parser.add_argument("--parallel", type=int, default=0, help="programs in flight at once (default: all)")
    parser.add_argument("--max-turns", type=int, default=None)
    parser.add_argument("--token-scale", type=float, default=1.0)
    parser.add_argument("--tool-time-scale", type=float, default=1.0)
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="the workers' --speedup: tool times are divided by it, durations multiplied back",
    )
    parser.add_argument("--no-session-headers", action="store_true", help="send no session headers (plain routing)")
    parser.add_argument("--worker-url", action="append", default=[], help="simworker URL whose counters to read")
    parser.add_argument("--seed", type=int, default=0)
    add_program_arguments(parser)
    parser.add_argument("--arm", default="endpoint", help="label for the report")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON report here")


def add_program_arguments(parser: argparse.ArgumentParser) -> None:
    """Where a run's programs come from (the live runner, bench.sim and bench.evaluate share these)."""
    parser.add_argument(
        "--trace",
        type=Path,
        default=None,
        help="JSONL trace in shared/traces/swe_agent_trace.jsonl's format (default: the shipped SWE-agent programs)",
    )
    parser.add_argument(
        "--split",
        default=DEFAULT_SPLIT,
        choices=SPLITS,
        help="part of the trace: tune (default), heldout or all (clients/workloads/draws.py)",
    )
    parser.add_argument(
        "--draw",
        default=DEFAULT_DRAW,
        choices=DRAWS,
        help="stratified: the trace's size mix (default); random: uniform with replacement",
    )
    parser.add_argument(
        "--include-longest",
        action="store_true",
        help="make sure the draw holds the split's longest program (most turns)",
    )


async def run_from_args(args: argparse.Namespace) -> dict:
    programs = build_workload(
        args.workload,
        args.programs,
        seed=args.seed,
        max_turns=args.max_turns,
        token_scale=args.token_scale,
        tool_time_scale=args.tool_time_scale,
        trace=args.trace,
        split=args.split,
        draw=args.draw,
        include_longest=args.include_longest,
    )
    total_turns = sum(len(p.turns) for p in programs)
    progress = ProgressBar(total_turns, label=f"{args.arm} turns")
    runner = Runner(
        args.endpoint,
        args.model,
        session_headers=not args.no_session_headers,
        time_scale=args.time_scale,
        seed=args.seed,
        arm=args.arm,
        progress=progress,
    )
    before = await scrape_counters(args.worker_url)
    result = await runner.run(programs, args.parallel or len(programs))
    progress.close()
    after = await scrape_counters(args.worker_url)
    result.worker_counters = {k: after[k] - before[k] for k in after} if args.worker_url else {}
    report = {
        "summary": result.summary(),
        "turns": [asdict(t) for t in result.turns],
        "programs": [asdict(p) for p in result.programs],
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bandmaster bench", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    return print_report(asyncio.run(run_from_args(args)))


if __name__ == "__main__":
    sys.exit(main())
