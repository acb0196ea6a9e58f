"""The real SWE-agent programs (GLM-4.5-FP8 on SWE-bench Lite), shipped with the repository."""

from __future__ import annotations

import gzip
import json
from functools import lru_cache
from pathlib import Path

from bench.workloads.model import Program, Turn

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
    """All 66 programs, or those recorded at `concurrency` (1, 4 or 32)."""
    programs = _load(str(path or DATA))
    if concurrency is not None:
        programs = tuple(p for p in programs if p.run_concurrency == concurrency)
    return list(programs)
