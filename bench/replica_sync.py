"""Router replica sync: how evenly two routers spread in-flight load over two workers, sync off vs on.

    python -m bench.replica_sync --out bench/results/replica_sync.json [--smoke]

One capacity service, two simworkers (real time: `--speedup 1`) and two routers (no scheduler, so the
router's own load-aware pick is what is measured), started as real processes, once per arm: `off` (each
router counts the turns it routed only) and `on` (`--router-replica-sync`). Each of the `--streams` client
loops is bound to one router (half on each) and sends `/generate` turns back to back: a distinct
random prompt (no prefix shared, so KV overlap plays no part) and a random output length. Every
`--sample-ms` the bench reads each worker's in-flight count (`sglang:num_running_reqs` +
`sglang:num_queue_reqs` from its /metrics) and records `max / mean` over the two workers (1.0 = even;
2.0 = all on one). Reported per arm: the mean and p90 of that ratio over the samples with load, and the
mean absolute difference in in-flight requests between the workers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.machine import machine
from services.common.process import orphan_guard
from services.common.process.child_stop import stop_child_async
from services.common.process.ready import wait_ready_file_async

ROOT = Path(__file__).resolve().parents[1]
IN_FLIGHT = re.compile(r"^sglang:num_(?:running|queue)_reqs(?:\{[^}]*\})? (\S+)$", re.M)


async def spawn(tmp: Path, name: str, module: str, args: list[str]) -> tuple[asyncio.subprocess.Process, dict]:
    ready = tmp / f"{name}.ready.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BANDMASTER_", "DYN_"))}
    env["PYTHONPATH"] = str(ROOT)
    env["BANDMASTER_LOG_LEVEL"] = "WARNING"
    with open(tmp / f"{name}.log", "wb") as log:
        proc = await asyncio.create_subprocess_exec(
            *orphan_guard.command(sys.executable, module, [*args, "--ready-file", str(ready)]),
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=log,
        )
    waiting = asyncio.ensure_future(wait_ready_file_async(ready, 60))
    exited = asyncio.ensure_future(proc.wait())
    await asyncio.wait({waiting, exited}, return_when=asyncio.FIRST_COMPLETED)
    exited.cancel()
    published = waiting.result() if waiting.done() else None
    waiting.cancel()
    if published is None:
        await stop_child_async(proc, 5.0, name=name)
        raise TimeoutError(f"{name} did not start (see {tmp / (name + '.log')})")
    return proc, published


async def in_flight(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(url + "/metrics") as r:
        return sum(float(v) for v in IN_FLIGHT.findall(await r.text()))


async def stream_loop(session: aiohttp.ClientSession, url: str, rng: random.Random, until: float, turns: list) -> None:
    while time.monotonic() < until:
        body = {
            "input_ids": [rng.randrange(1, 30_000) for _ in range(256)],
            "sampling_params": {"max_new_tokens": rng.randrange(20, 200), "ignore_eos": True},
        }
        async with session.post(url + "/generate", json=body) as r:
            await r.read()
            turns.append(r.status)


async def run_arm(sync: bool, streams: int, duration_s: float, sample_ms: float, seed: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix=f"replica-sync-{'on' if sync else 'off'}-"))
    procs: list[tuple[str, asyncio.subprocess.Process]] = []
    try:
        workers = []
        for i in range(2):
            proc, ready = await spawn(
                tmp, f"w{i}", "services.simworker", ["--port", "0", "--speedup", "1", "--enable-cache-report"]
            )
            procs.append((f"w{i}", proc))
            workers.append(ready["url"])
        flags = [f for url in workers for f in ("--worker-url", url)]
        proc, cap = await spawn(
            tmp,
            "capacity",
            "services.capacity",
            [
                "--listen",
                "127.0.0.1:0",
                "--metrics-port",
                "-1",
                "--poll-interval-seconds",
                "1",
                "--poll-timeout-seconds",
                "0.5",
                *flags,
            ],
        )
        procs.append(("capacity", proc))
        routers = []
        for name in ("ra", "rb"):
            args = ["--capacity-addr", cap["grpc"], "--no-scheduler", "--listen", "127.0.0.1:0", "--http-port", "0"]
            args += ["--metrics-port", "-1", "--router-temperature", "0"]
            proc, ready = await spawn(
                tmp, name, "services.router", [*args, *(["--router-replica-sync"] if sync else [])]
            )
            procs.append((name, proc))
            routers.append(f"http://127.0.0.1:{ready['http_port']}")
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            for url in routers:  # both routers know both workers before the load starts
                while True:
                    async with session.get(url + "/health") as r:
                        if r.status == 200 and (await r.json()).get("workers") == 2:
                            break
                    await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)  # the peers' first reports
            turns: list[int] = []
            until = time.monotonic() + duration_s
            loops = [
                asyncio.create_task(stream_loop(session, routers[i % 2], random.Random(seed * 1000 + i), until, turns))
                for i in range(streams)
            ]
            ratios, gaps = [], []
            while time.monotonic() < until:
                counts = await asyncio.gather(*(in_flight(session, url) for url in workers))
                if sum(counts) > 0:
                    ratios.append(max(counts) / statistics.fmean(counts))
                    gaps.append(abs(counts[0] - counts[1]))
                await asyncio.sleep(sample_ms / 1000.0)
            await asyncio.gather(*loops)
        ratios.sort()
        shutil.rmtree(tmp, ignore_errors=True)  # kept, with the logs, when an arm fails
        return {
            "sync": sync,
            "streams": streams,
            "turns": len(turns),
            "failed_turns": sum(1 for s in turns if s != 200),
            "samples": len(ratios),
            "max_over_mean_in_flight": {
                "mean": statistics.fmean(ratios) if ratios else None,
                "p90": ratios[int(0.9 * (len(ratios) - 1))] if ratios else None,
            },
            "mean_abs_difference_in_flight": statistics.fmean(gaps) if gaps else None,
        }
    finally:
        for name, proc in reversed(procs):
            await stop_child_async(proc, 10.0, name=name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replica_sync", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/replica_sync.json")
    parser.add_argument("--smoke", action="store_true", help="seconds, not a minute: for the test suite")
    parser.add_argument("--streams", default="2,6", help="comma-separated client loop counts (half per router)")
    parser.add_argument("--duration-s", type=float, default=None)
    parser.add_argument("--sample-ms", type=float, default=50.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    duration_s = args.duration_s or (4.0 if args.smoke else 30.0)
    streams = [int(s) for s in args.streams.split(",")]
    arms = []
    for n in streams:
        for sync in (False, True):
            arms.append(asyncio.run(run_arm(sync, n, duration_s, args.sample_ms, args.seed)))
    report = {
        "benchmark": "replica_sync",
        "smoke": args.smoke,
        "duration_s": duration_s,
        "machine": machine(),
        "arms": arms,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'streams':>8} {'sync':>5} {'turns':>6} {'max/mean mean':>14} {'p90':>6} {'|w0-w1|':>8}")
    for arm in arms:
        ratio = arm["max_over_mean_in_flight"]
        print(
            f"{arm['streams']:8d} {'on' if arm['sync'] else 'off':>5} {arm['turns']:6d} "
            f"{ratio['mean'] or float('nan'):14.3f} {ratio['p90'] or float('nan'):6.3f} "
            f"{arm['mean_abs_difference_in_flight'] or float('nan'):8.3f}"
        )
    print(f"report written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
