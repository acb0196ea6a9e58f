"""Two trees' ticks side by side, one tick at a time in turn, so both meet the same machine load.

    python -m bench.tick_lockstep --tree was=/tmp/old-checkout --tree now=. --programs 10000 \
        --pause-policy cost_aware --ticks 20

Each tree runs the tick benchmark's mix (`bench.scheduler_bench.bench_tick`, from that tree, with its
`settle_heap`) in a process of its own. The driver lets one tick run at a time, alternating which
tree goes first, and reads each tick's wall and thread CPU time and its pauses / resumes / marks.
On a shared machine two runs minutes apart meet different loads and a 10% change is lost in them;
paired ticks are not. The report has each tree's p50 / p99 and the median over ticks of the CPU
ratio of each tree to the first, and fails if the trees' ticks do not decide alike: the same pauses,
resumes and marks, and the same events, log lines and resolutions (a digest of each tick's, the
benchmark's `decisions_sha256` per tick; the report's is over every tick).
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def worker(programs: int, replicas: int, ticks: int, pause_policy: str) -> None:
    """Run in the tree under test: the mix, each tick waiting for the driver's go."""
    # The tree's own benchmark, with the collector's settings it applies (the scheduler's `settle_heap`).
    from bench.scheduler_bench import bench_tick, settle_heap, tick_core

    settle_heap()
    core = tick_core(pause_policy)
    tick = core.tick

    def one_tick(now, snapshot=None):
        print("ready", flush=True)
        sys.stdin.readline()
        wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
        result = tick(now, snapshot)
        cpu, wall = time.thread_time_ns() - cpu, time.perf_counter_ns() - wall
        # The tick's decisions whole (events, log lines, resolutions), as the benchmark's decisions_sha256.
        digest = hashlib.sha256(repr((result.events, result.logs, result.resolutions)).encode()).hexdigest()
        row = [wall / 1e6, cpu / 1e6, result.paused, result.resumed, result.marked, digest]
        print(json.dumps(row), flush=True)
        return result

    if "tick" in inspect.signature(bench_tick).parameters:
        bench_tick(programs, replicas, ticks, core=core, tick=one_tick)
    else:  # a tree from before bench_tick took `tick` (and before the compiled core): its tick is replaced
        core.tick = one_tick  # type: ignore[method-assign]
        bench_tick(programs, replicas, ticks, core=core)
    print("end", flush=True)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def drive(trees: list[tuple[str, Path]], programs: int, replicas: int, ticks: int, pause_policy: str) -> dict:
    args = ["--worker", "--programs", str(programs), "--replicas", str(replicas), "--ticks", str(ticks)]
    args += ["--pause-policy", pause_policy]
    procs = {}
    for name, path in trees:
        env = {**os.environ, "PYTHONPATH": str(path)}
        procs[name] = subprocess.Popen(
            # This file, run by its path: the tree under test need not have it.
            [sys.executable, str(Path(__file__).resolve()), *args],
            cwd=path,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
    for proc in procs.values():
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    # Per tick: wall ms, CPU ms, pauses, resumes, marks, the digest of its decisions.
    rows: dict[str, list[list]] = {name: [] for name in procs}
    names = list(procs)
    for i in range(ticks):
        for name in names if i % 2 == 0 else names[::-1]:
            proc = procs[name]
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
            rows[name].append(json.loads(proc.stdout.readline()))
            assert proc.stdout.readline().strip() in ("ready", "end")
    for proc in procs.values():
        proc.wait()
    first = names[0]
    decisions = {name: [row[2:] for row in rows[name]] for name in names}
    if any(decisions[name] != decisions[first] for name in names):
        raise SystemExit("the trees' ticks decide differently (pauses, resumes, marks or their events and logs)")
    report: dict = {"programs": programs, "replicas": replicas, "ticks": ticks, "pause_policy": pause_policy}
    for name in names:
        wall, cpu = [row[0] for row in rows[name]], [row[1] for row in rows[name]]
        report[name] = {
            "wall_ms": {"p50": _percentile(wall, 50), "p99": _percentile(wall, 99)},
            "cpu_ms": {
                "p50": _percentile(cpu, 50),
                "p99": _percentile(cpu, 99),
                "first_tick": cpu[0],
                "max_after_first": max(cpu[1:], default=None),
            },
            "cpu_ratio_to_" + first: statistics.median(b[1] / a[1] for a, b in zip(rows[first], rows[name])),
        }
    report["pauses_resumes_marks_per_tick"] = [row[:3] for row in decisions[first]]
    every_tick = hashlib.sha256("".join(row[3] for row in decisions[first]).encode()).hexdigest()
    report["decisions_sha256"] = every_tick  # the same in every tree, or the run fails above
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tick_lockstep", description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=PATH", help="a checkout (two or more)")
    parser.add_argument("--programs", type=int, default=10_000)
    parser.add_argument("--replicas", type=int, default=64)
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--pause-policy", choices=("cost_aware", "threshold"), default="cost_aware")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.programs, args.replicas, args.ticks, args.pause_policy)
        return 0
    trees = []
    for spec in args.tree:
        name, _, path = spec.partition("=")
        if not path:
            parser.error(f"--tree wants NAME=PATH, got {spec!r}")
        trees.append((name, Path(path).resolve()))
    if len(trees) < 2:
        parser.error("give two --tree or more")
    # Imported here: the workers run this file in trees that may have no bench.machine.
    from bench.machine import loadavg, machine

    load_before = loadavg()
    report = drive(trees, args.programs, args.replicas, args.ticks, args.pause_policy)
    report["loadavg_before"] = load_before
    report["loadavg"] = loadavg()
    report["machine"] = machine()
    print(json.dumps({k: v for k, v in report.items() if k != "pauses_resumes_marks_per_tick"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
