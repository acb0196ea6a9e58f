"""Derive the committed agent workload from the SWE-agent trace.

    python scripts/extract_trace_workload.py ../shared/traces/swe_agent_trace.jsonl

Keeps only what a replay needs (per turn: prompt tokens, output tokens, tool seconds after; per
program: its id and recorded concurrency) so that the demo and benchmarks run from a fresh clone.
The figures come from the public ThunderAgent profiling logs (see docs/workloads.md).
"""

from __future__ import annotations

import gzip
import json
import pathlib
import sys

OUT = pathlib.Path(__file__).resolve().parent.parent / "bench" / "workloads" / "data" / "swe_agent_programs.jsonl.gz"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    rows = []
    with open(argv[0]) as fh:
        for line in fh:
            program = json.loads(line)
            rows.append({
                "program_id": f"c{program['run_concurrency']}/{program['task']}",
                "task": program["task"],
                "run_concurrency": program["run_concurrency"],
                "turns": [[t["input_tokens"], t["output_tokens"], round(t["tool_seconds_after"], 3)]
                          for t in program["turns"]],
            })
    OUT.parent.mkdir(parents=True, exist_ok=True)
    # mtime=0 keeps the file byte-identical across runs.
    with gzip.GzipFile(OUT, "wb", mtime=0) as gz:
        for row in rows:
            gz.write((json.dumps(row, separators=(",", ":")) + "\n").encode())
    print(f"wrote {len(rows)} programs to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
