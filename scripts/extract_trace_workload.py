"""Derive the committed agent workload from the SWE-agent trace.

    python scripts/extract_trace_workload.py ../shared/traces

Keeps only what a replay needs (per turn: prompt tokens, output tokens, tool seconds after; per
program: its id, recorded concurrency and environment set-up time) so that the demo, benchmarks and
the simworker fidelity test run from a fresh clone; and, from timing_calibration.jsonl, the per-call
timing fields the fidelity test compares against. The figures come from the public ThunderAgent
profiling logs (see docs/workloads.md).
"""

from __future__ import annotations

import gzip
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "workloads" / "data" / "swe_agent_programs.jsonl.gz"
CALIBRATION_OUT = ROOT / "tests" / "fidelity" / "data" / "timing_calibration_rows.jsonl.gz"
CALIBRATION_FIELDS = (
    "program_id",
    "run_concurrency",
    "run_warmup",
    "prefill_time_s",
    "decode_time_s",
    "output_tokens_est",
    "output_estimate",
    "input_tokens",
)


def write_gz(path: pathlib.Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # mtime=0 keeps the file byte-identical across runs.
    with gzip.GzipFile(path, "wb", mtime=0) as gz:
        for row in rows:
            gz.write((json.dumps(row, separators=(",", ":")) + "\n").encode())


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    traces = pathlib.Path(argv[0])
    rows = []
    with open(traces / "swe_agent_trace.jsonl") as fh:
        for line in fh:
            program = json.loads(line)
            rows.append(
                {
                    "program_id": f"c{program['run_concurrency']}/{program['task']}",
                    "task": program["task"],
                    "run_concurrency": program["run_concurrency"],
                    "env_prepare_seconds": program.get("env_prepare_seconds", 0.0),
                    "turns": [
                        [t["input_tokens"], t["output_tokens"], round(t["tool_seconds_after"], 3)]
                        for t in program["turns"]
                    ],
                }
            )
    write_gz(OUT, rows)
    print(f"wrote {len(rows)} programs to {OUT}")
    calibration = []
    with open(traces / "timing_calibration.jsonl") as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                calibration.append({k: row.get(k) for k in CALIBRATION_FIELDS})
    write_gz(CALIBRATION_OUT, calibration)
    print(f"wrote {len(calibration)} calibration rows to {CALIBRATION_OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
