"""Real agent programs: the SWE-agent trace shipped with the repository, or any trace file in its format.

Two formats:

* the shipped data (`data/swe_agent_programs.jsonl.gz`, written by scripts/extract_trace_workload.py):
  one compact line per program, `turns` as `[input_tokens, output_tokens, tool_seconds_after]`
  triples, programs named `c<run_concurrency>/<task>`;
* a trace file (`load_trace`, the `--trace FILE` of bench.sim, bench.compare and bench.evaluate):
  JSONL in the format of shared/traces/swe_agent_trace.jsonl, one program per line:

      {"program_id": "...", "run_concurrency": 4,            # run_concurrency optional
       "turns": [{"input_tokens": 447, "output_tokens": 212, "tool_seconds_after": 0.75}, ...]}

  Other fields are ignored. Every line is validated; the first malformed one raises ConfigError
  naming the file, the line and the rule.
"""

from __future__ import annotations

import gzip
import json
import math
from functools import lru_cache
from pathlib import Path

from clients.workloads.model import Program, Turn
from services.common.settings.errors import ConfigError

DATA = Path(__file__).resolve().parent / "data" / "swe_agent_programs.jsonl.gz"


@lru_cache(maxsize=4)
def _load(path: str) -> tuple[Program, ...]:
    programs = []
    with gzip.open(path, "rt") as fh:
        for line in fh:
            row = json.loads(line)
            turns = tuple(Turn(int(i), int(o), float(t)) for i, o, t in row["turns"])
            programs.append(Program(row["program_id"], turns, int(row["run_concurrency"])))
    return tuple(programs)


def swe_agent_programs(*, concurrency: int | None = None, path: Path | None = None) -> list[Program]:
    """All 66 shipped programs, or those recorded at `concurrency` (1, 4 or 32)."""
    programs = _load(str(path or DATA))
    if concurrency is not None:
        programs = tuple(p for p in programs if p.run_concurrency == concurrency)
    return list(programs)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


def _turn(row: dict, k: int) -> Turn:
    """One turn of a trace line. output_tokens 0 (a call that generated nothing) counts as 1 token:
    every call generates at least its end token, and the engines need one."""
    if not isinstance(row, dict):
        raise ValueError(f"turns[{k}] is not an object")
    for key in ("input_tokens", "output_tokens", "tool_seconds_after"):
        if key not in row:
            raise ValueError(f"turns[{k}] has no {key}")
    if not _is_int(row["input_tokens"]) or row["input_tokens"] < 1:
        raise ValueError(f"turns[{k}].input_tokens={row['input_tokens']!r}: expected an integer >= 1")
    if not _is_int(row["output_tokens"]) or row["output_tokens"] < 0:
        raise ValueError(f"turns[{k}].output_tokens={row['output_tokens']!r}: expected an integer >= 0")
    if not _is_number(row["tool_seconds_after"]) or row["tool_seconds_after"] < 0:
        raise ValueError(f"turns[{k}].tool_seconds_after={row['tool_seconds_after']!r}: expected a finite number >= 0")
    return Turn(row["input_tokens"], max(1, row["output_tokens"]), float(row["tool_seconds_after"]))


def _program(line: str) -> Program:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(row, dict):
        raise ValueError("expected one JSON object per line")
    program_id = row.get("program_id")
    if not isinstance(program_id, str) or not program_id:
        raise ValueError(f"program_id={program_id!r}: expected a non-empty string")
    turns = row.get("turns")
    if not isinstance(turns, list) or not turns:
        raise ValueError("turns: expected a non-empty list")
    concurrency = row.get("run_concurrency", 0)
    if not _is_int(concurrency) or concurrency < 0:
        raise ValueError(f"run_concurrency={concurrency!r}: expected an integer >= 0")
    return Program(program_id, tuple(_turn(t, k) for k, t in enumerate(turns)), concurrency)


@lru_cache(maxsize=8)
def _load_trace(path: str, mtime_ns: int, size: int) -> tuple[Program, ...]:
    programs: list[Program] = []
    seen: dict[str, int] = {}
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                program = _program(line)
            except ValueError as exc:
                raise ConfigError("trace", f"{path}:{number}", str(exc)) from None
            if program.program_id in seen:
                raise ConfigError(
                    "trace",
                    f"{path}:{number}",
                    f"program_id {program.program_id!r} repeats line {seen[program.program_id]}",
                )
            seen[program.program_id] = number
            programs.append(program)
    if not programs:
        raise ConfigError("trace", path, "the file holds no programs")
    return tuple(programs)


def load_trace(path: str | Path) -> list[Program]:
    """The programs of a JSONL trace file in shared/traces/swe_agent_trace.jsonl's format (see the
    module docstring); `.gz` files are read compressed. Raises ConfigError naming the line on the
    first malformed one, and for a missing or empty file."""
    text = str(path)
    try:
        stat = Path(text).stat()
    except OSError as exc:
        raise ConfigError("trace", text, f"cannot read the file ({exc.strerror})") from None
    return list(_load_trace(text, stat.st_mtime_ns, stat.st_size))


def trace_programs(trace: str | Path | None = None) -> list[Program]:
    """The programs of `trace`, or the shipped SWE-agent programs when it is None."""
    return swe_agent_programs() if trace is None else load_trace(trace)
