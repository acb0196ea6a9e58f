"""Live simworker throughput: one `python -m services.simworker` process, many streaming clients.

    python -m bench.simworker_live --out bench/results/simworker_live.json [--smoke]

The worker runs at a high `--speedup` so that the HTTP/SSE path and the driver loop, not the
simulated GPU, are the bottleneck. `--clients` closed-loop clients (64 by default) each send
streaming `/v1/chat/completions` requests back to back for `--duration-s`: a shared system
prompt (prefix-cache hits, as with an agent) plus a per-request user turn, `max_tokens` fixed
with `ignore_eos` so every request streams exactly that many tokens. Reported: requests/s and
streamed tokens/s (wall clock), client-side TTFT and inter-chunk gaps, and the worker's own
view (steps, how far its loop ran behind the simulated clock, virtual generation throughput).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.machine import machine
from clients.stats import summary_ms
from services.common.process import orphan_guard
from services.common.process.child_stop import stop_child_async

ROOT = Path(__file__).resolve().parents[1]
MODEL = "bench-model"
SYSTEM_PROMPT = " ".join(f"rule {i}: read the repository, run the tests, fix what fails." for i in range(60))


async def _wait_ready(path: Path, proc: asyncio.subprocess.Process, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            return json.loads(path.read_text())
        if proc.returncode is not None:
            raise RuntimeError(f"simworker exited with {proc.returncode}")
        await asyncio.sleep(0.05)
    raise TimeoutError("simworker did not become ready")


class ClientStats:
    def __init__(self) -> None:
        self.requests = 0
        self.errors = 0
        self.tokens = 0
        self.chunks = 0
        self.ttft_s: list[float] = []
        self.gap_s: list[float] = []


async def client_loop(
    session: aiohttp.ClientSession, url: str, index: int, max_tokens: int, stop_at: float, stats: ClientStats
) -> None:
    turn = 0
    while time.monotonic() < stop_at:
        turn += 1
        body = {
            "model": MODEL,
            "stream": True,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": f"client {index} turn {turn}: what next?"},
            ],
        }
        sent = time.monotonic()
        last = None
        try:
            async with session.post(url + "/v1/chat/completions", json=body) as response:
                if response.status != 200:
                    stats.errors += 1
                    await response.read()
                    continue
                async for line in response.content:
                    if not line.startswith(b"data: {"):
                        continue
                    now = time.monotonic()
                    chunk = json.loads(line[6:])
                    if chunk.get("usage") and not chunk["choices"]:
                        stats.tokens += chunk["usage"]["completion_tokens"]
                        continue
                    if chunk["choices"][0]["delta"].get("content"):
                        stats.chunks += 1
                        if last is None:
                            stats.ttft_s.append(now - sent)
                        else:
                            stats.gap_s.append(now - last)
                        last = now
            stats.requests += 1
        except (aiohttp.ClientError, asyncio.TimeoutError):
            stats.errors += 1


def _metric(text: str, name: str) -> float | None:
    match = re.search(r"^" + re.escape(name) + r"\{[^}]*\} (\S+)$", text, re.M)
    return float(match.group(1)) if match else None


async def run(clients: int, duration_s: float, max_tokens: int, speedup: float, warmup_s: float) -> dict:
    tmp = tempfile.mkdtemp(prefix="simworker-live-")
    ready = Path(tmp) / "ready.json"
    proc = await asyncio.create_subprocess_exec(
        *orphan_guard.command(
            sys.executable,
            "services.simworker",
            [
                "--port",
                "0",
                "--model-name",
                MODEL,
                "--speedup",
                str(speedup),
                "--ready-file",
                str(ready),
                "--log-level",
                "WARNING",
                "--max-running-requests",
                str(max(256, clients)),
                "--max-total-tokens",
                "262144",
            ],
        ),
        cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL,
    )
    try:
        info = await _wait_ready(ready, proc, 60)
        url = f"http://127.0.0.1:{info['port']}"
        connector = aiohttp.TCPConnector(limit=clients * 2)
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            if warmup_s > 0:
                warm = ClientStats()
                stop_at = time.monotonic() + warmup_s
                await asyncio.gather(*(client_loop(session, url, i, max_tokens, stop_at, warm) for i in range(clients)))
            async with session.get(url + "/server_info") as r:
                before = (await r.json())["internal_states"][0]
            stats = ClientStats()
            started = time.monotonic()
            stop_at = started + duration_s
            cpu0 = time.process_time()
            await asyncio.gather(*(client_loop(session, url, i, max_tokens, stop_at, stats) for i in range(clients)))
            elapsed = time.monotonic() - started
            client_cpu_s = time.process_time() - cpu0
            async with session.get(url + "/server_info") as r:
                after = (await r.json())["internal_states"][0]
            async with session.get(url + "/metrics") as r:
                metrics_text = await r.text()
    finally:
        await stop_child_async(proc, 15.0, name="simworker")
    steps = after["simworker_steps"] - before["simworker_steps"]
    late_s = after["simworker_late_s_total"] - before["simworker_late_s_total"]
    return {
        "clients": clients,
        "duration_s": round(elapsed, 3),
        "max_tokens": max_tokens,
        "speedup": speedup,
        "requests": stats.requests,
        "errors": stats.errors,
        "requests_per_s": stats.requests / elapsed,
        "streamed_tokens": stats.tokens,
        "streamed_tokens_per_s": stats.tokens / elapsed,
        "content_chunks_per_s": stats.chunks / elapsed,
        "client_ttft_ms": summary_ms(stats.ttft_s),
        "client_inter_chunk_ms": summary_ms(stats.gap_s),
        "client_cpu_s": round(client_cpu_s, 3),
        "worker": {
            "steps": steps,
            "steps_per_s": steps / elapsed,
            "loop_late_s": round(late_s, 3),
            # Fraction of wall time the loop spent behind the simulated clock (0 = on schedule).
            "loop_late_fraction": late_s / elapsed,
            "gen_throughput_virtual_tok_s": _metric(metrics_text, "sglang:gen_throughput"),
            "cache_hit_rate": _metric(metrics_text, "sglang:cache_hit_rate"),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.simworker_live", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/simworker_live.json")
    parser.add_argument("--smoke", action="store_true", help="a few seconds with few clients, for the test suite")
    parser.add_argument("--clients", type=int, default=None)
    parser.add_argument("--duration-s", type=float, default=None)
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--speedup", type=float, default=100.0)
    args = parser.parse_args(argv)
    clients = args.clients or (8 if args.smoke else 64)
    duration_s = args.duration_s or (1.5 if args.smoke else 20.0)
    max_tokens = args.max_tokens or (16 if args.smoke else 128)
    result = asyncio.run(run(clients, duration_s, max_tokens, args.speedup, 0.0 if args.smoke else 2.0))
    report = {
        "benchmark": "simworker_live",
        "smoke": args.smoke,
        "machine": machine(),
        "result": result,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    r = result
    print(
        f"simworker live: {r['clients']} streaming clients, {r['max_tokens']} tokens/request, "
        f"speedup {r['speedup']:g}, {r['duration_s']:.1f} s"
    )
    print(f"{'measure':36} {'value':>12}")
    print(f"{'requests/s':36} {r['requests_per_s']:12.1f}")
    print(f"{'streamed tokens/s':36} {r['streamed_tokens_per_s']:12.0f}")
    print(f"{'requests (errors)':36} {r['requests']:>8} ({r['errors']})")
    print(f"{'client TTFT ms p50 / p99':36} {r['client_ttft_ms']['p50']:7.1f} / {r['client_ttft_ms']['p99']:.1f}")
    print(
        f"{'client inter-chunk ms p50 / p99':36} {r['client_inter_chunk_ms']['p50']:7.2f} / "
        f"{r['client_inter_chunk_ms']['p99']:.2f}"
    )
    print(f"{'worker steps/s':36} {r['worker']['steps_per_s']:12.0f}")
    print(f"{'worker loop late fraction':36} {r['worker']['loop_late_fraction']:12.2f}")
    print(f"report written to {out}")
    return 0 if r["requests"] > 0 and r["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
