"""Proxy overhead: added TTFT and streamed tokens/s through our router vs direct vs sglang-router.

    python -m bench.router_bench --out bench/results/router_bench.json [--smoke] [--duration-s S]
                                 [--concurrency 64,256] [--repeats 2]

One set of simworker processes at a high `--speedup` (the simulated GPU takes next to no time, so
the HTTP/SSE path dominates) is put behind every proxy at once:

* `direct`               - no proxy; stream i talks to worker i mod N.
* `bandmaster`           - capacity + scheduler + router (`start_cluster`); every stream is one
                           program (`X-Dynamo-Session-ID`), closed by a final request at the end.
* `bandmaster-nosched`   - a second router on the same capacity service with `--no-scheduler`
                           (KV-aware pick only, no Admit round trip); no session headers.
* `bandmaster-2proc`     - a third router, `--processes 2`, on the same capacity and scheduler as
                           `bandmaster`, programs and finals as there.
* `sglang-router`        - `sglang_router.launch_router --policy cache_aware` on the same workers.
* `baseline`, `baseline-nosched` (only with `--baseline-ref REF`) - `bandmaster` and `bandmaster-nosched`
                           run by the router of git commit REF (`git archive` into a temporary directory),
                           on the same capacity service, scheduler and workers: a before/after comparison
                           of the router measured side by side in one run.

This process is the load generator: C closed-loop aiohttp SSE streams of `/v1/chat/completions`
(fixed prompt size, fixed `max_tokens` with `ignore_eos`). Each phase = one arm at one concurrency
for a warm-up then a fixed measured window; phases run arm by arm in alternating order (ABCD, then
DCBA, ...) so that drift on the shared machine hits every arm alike. Per phase we record TTFT
(send -> first content token), streamed tokens and completed requests inside the window, errors
(non-200, transport failures, short streams, failed finals; warm-up and drain included) and the CPU
seconds every process used. Arms are then compared by ratio, never against absolute thresholds.
Each Bandmaster arm's own /metrics, read before and after each phase, give the turns that failed open
(by reason), the Admit windows lengthened by the router's loop lag, and the router's event-loop lag
(p99 from its histogram: the upper bound of the bucket that holds it). `targets` in the report states
issue 20's router targets against the figures of the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path

import aiohttp

from bench.machine import machine
from bench.peers import chat_ok, launch_sglang_router
from clients.stats import summary_ms
from services.common.process.child_start import start_child
from services.common.process.child_stop import stop_child
from services.common.process.ready import wait_ready_file
from services.common.web.session_ids import FINAL_HEADER, SESSION_HEADER
from services.launcher.cluster import Cluster, ClusterConfig, router_spec, start_cluster
from services.launcher.supervisor import Supervisor

ROOT = Path(__file__).resolve().parents[1]
MODEL = "router-bench-model"
ARMS = ("direct", "bandmaster", "bandmaster-nosched", "bandmaster-2proc", "sglang-router")
BASELINE_ARMS = ("baseline", "baseline-nosched")
"""With --baseline-ref: the router of another commit, with and without the scheduler."""
SCHEDULED_ARMS = ("bandmaster", "bandmaster-2proc", "baseline")
"""Arms whose streams are programs (session headers, a final request) admitted by the scheduler."""
# One filler word is one simworker token (pieces of <= 4 non-space characters), so the prompt size
# is controlled by the word count; the chat template adds a handful of tokens.
FILLER_WORD = " tok"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------------- stats


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


@dataclass
class PhaseStats:
    """Counters of one phase. `measuring` is flipped by the phase clock, not by the streams."""

    measuring: bool = False
    tokens: int = 0
    tokens_all: int = 0
    """Tokens of the whole phase (warm-up and drain too): the denominator of the phase's CPU seconds."""
    requests: int = 0
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    ttft_s: list[float] = field(default_factory=list)

    def error(self, kind: str) -> None:
        self.errors += 1
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1


# ---------------------------------------------------------------------------------------- load


@dataclass(frozen=True)
class Load:
    concurrency: int
    prompt_tokens: int
    max_tokens: int
    warmup_s: float
    duration_s: float


async def stream_loop(
    session: aiohttp.ClientSession,
    url: str,
    load: Load,
    stats: PhaseStats,
    index: int,
    session_id: str | None,
    stop: asyncio.Event,
) -> None:
    """One closed-loop stream; with `session_id` every request is a turn of that program, then a final."""
    headers = {SESSION_HEADER: session_id} if session_id else {}
    prompt = f"stream {index}:" + FILLER_WORD * load.prompt_tokens
    turn = 0
    while not stop.is_set():
        turn += 1
        body = {
            "model": MODEL,
            "stream": True,
            "max_tokens": load.max_tokens,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": f"{prompt} turn {turn}"}],
        }
        sent = time.monotonic()
        counted = stats.measuring
        content_chunks = 0
        usage_tokens = -1
        try:
            async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as response:
                if response.status != 200:
                    await response.read()
                    stats.error(f"http_{response.status}")
                    continue
                # Byte tests rather than json.loads per line keep the client cheap: it shares two cores
                # with the workers and proxies. Only the usage line is parsed.
                async for line in response.content:
                    if b'{"content":"' in line:
                        if content_chunks == 0 and counted:
                            stats.ttft_s.append(time.monotonic() - sent)
                        content_chunks += 1
                        stats.tokens_all += 1
                        if stats.measuring:
                            stats.tokens += 1
                    elif b'"usage":{' in line and line.startswith(b"data: {"):
                        usage_tokens = json.loads(line[6:])["usage"]["completion_tokens"]
        except (aiohttp.ClientError, asyncio.TimeoutError):
            stats.error("transport")
            continue
        if content_chunks != load.max_tokens or usage_tokens != load.max_tokens:
            stats.error("short_stream")
        elif stats.measuring:
            stats.requests += 1
    if session_id:
        final = {**headers, FINAL_HEADER: "true"}
        body = {"model": MODEL, "messages": []}  # no content: the final request only releases the program
        try:
            async with session.post(url + "/v1/chat/completions", json=body, headers=final) as response:
                await response.read()
                if response.status != 200:
                    stats.error(f"final_http_{response.status}")
        except (aiohttp.ClientError, asyncio.TimeoutError):
            stats.error("final_transport")


async def run_phase(urls: list[str], load: Load, session_prefix: str | None) -> tuple[PhaseStats, float]:
    """Warm up, measure for `duration_s`, stop issuing, drain. Returns the stats and the window length."""
    stats = PhaseStats()
    stop = asyncio.Event()
    connector = aiohttp.TCPConnector(limit=load.concurrency + 8, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks = [
            asyncio.create_task(
                stream_loop(
                    session,
                    urls[i % len(urls)],
                    load,
                    stats,
                    i,
                    f"{session_prefix}-{i}" if session_prefix else None,
                    stop,
                )
            )
            for i in range(load.concurrency)
        ]
        await asyncio.sleep(load.warmup_s)
        stats.measuring = True
        started = time.monotonic()
        await asyncio.sleep(load.duration_s)
        stats.measuring = False
        window_s = time.monotonic() - started
        stop.set()
        await asyncio.gather(*tasks)
    return stats, window_s


# ---------------------------------------------------------------------------------------- stack


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def worker_requests(url: str) -> float:
    """`sglang:num_requests_total` of one worker (requests its engine accepted)."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
            text = response.read().decode()
    except (urllib.error.URLError, OSError):
        return float("nan")
    match = re.search(r"^sglang:num_requests_total\{[^}]*\} (\S+)$", text, re.M)
    return float(match.group(1)) if match else float("nan")


def router_counters(metrics_url: str) -> dict[str, float]:
    """The router's fail-open, deadline-extension and loop-lag series at `metrics_url`, summed over its
    processes (`router_process`), keyed `fail_open:<reason>`, `deadline_extended`, `lag_le:<bound>`."""
    try:
        with urllib.request.urlopen(metrics_url + "/metrics", timeout=10) as response:
            text = response.read().decode()
    except (urllib.error.URLError, OSError):
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("bandmaster_router_scheduler_fail_open_total{"):
            key = "fail_open:" + re.search(r'reason="([^"]*)"', line).group(1)  # type: ignore[union-attr]
        elif line.startswith("bandmaster_router_admit_deadline_extended_total"):
            key = "deadline_extended"
        elif line.startswith("bandmaster_event_loop_lag_seconds_bucket{"):
            key = "lag_le:" + re.search(r'le="([^"]*)"', line).group(1)  # type: ignore[union-attr]
        else:
            continue
        out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def lag_p99_s(delta: dict[str, float]) -> float:
    """The upper bound of the loop-lag bucket holding the 99th percentile of a phase's samples (nan: none)."""
    buckets = sorted((float(key.split(":", 1)[1]), count) for key, count in delta.items() if key.startswith("lag_le:"))
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return float("nan")
    for bound, count in buckets:
        if count >= 0.99 * total:
            return bound
    return float("inf")


@dataclass
class Stack:
    cluster: Cluster
    nosched_url: str
    twoproc_url: str
    sglang: subprocess.Popen
    sglang_url: str
    pids: dict[str, list[int]]
    metrics_urls: dict[str, str]
    """Arm -> the /metrics base URL of its router (Bandmaster arms)."""
    baseline_urls: dict[str, str] = field(default_factory=dict)
    baseline: list[subprocess.Popen] = field(default_factory=list)

    def urls(self, arm: str) -> list[str]:
        if arm in self.baseline_urls:
            return [self.baseline_urls[arm]]
        return {
            "direct": self.cluster.workers,
            "bandmaster": [self.cluster.http_url],
            "bandmaster-nosched": [self.nosched_url],
            "bandmaster-2proc": [self.twoproc_url],
            "sglang-router": [self.sglang_url],
        }[arm]

    def cpu(self) -> dict[str, float]:
        return {group: sum(cpu_seconds(pid) for pid in pids) for group, pids in self.pids.items()}

    def stop(self) -> None:
        for process in self.baseline:
            stop_process(process)
        if self.sglang.poll() is None:
            self.sglang.send_signal(signal.SIGTERM)
            try:
                self.sglang.wait(10)
            except subprocess.TimeoutExpired:
                self.sglang.kill()
                self.sglang.wait()
        self.cluster.stop()


def stop_process(process: subprocess.Popen) -> None:
    stop_child(process, 10.0, name="router-bench child")


def checkout(ref: str, into: Path) -> str:
    """The tree of git commit `ref` in `into` (git archive: the repository is not touched); its full hash."""
    commit = subprocess.run(
        ["git", "rev-parse", "--verify", f"{ref}^{{commit}}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.Popen(["git", "archive", commit], cwd=ROOT, stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(into)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise RuntimeError(f"git archive {commit} failed")
    return commit


def start_baseline_router(tree: Path, spec, state_dir: Path, name: str) -> tuple[subprocess.Popen, dict]:
    """`spec` (a router's ChildSpec) run from the source tree `tree` (its cwd, so that `python -m` imports
    that tree's services); returns the process and its ready file once written."""
    ready = state_dir / f"{name}.ready.json"
    ready.unlink(missing_ok=True)
    process = start_child(
        [sys.executable, "-m", spec.module, *spec.args, "--ready-file", str(ready)],
        state_dir / f"{name}.log",
        cwd=tree,
        env={**os.environ, **spec.env, "PYTHONUNBUFFERED": "1"},
    )
    info = wait_ready_file(ready, 120, alive=lambda: process.poll() is None, interval_s=0.1)
    if info is None:
        stop_process(process)
        raise RuntimeError(f"{name} did not start; see {state_dir / f'{name}.log'}")
    return process, info


def start_stack(
    workers: int, speedup: float, kv_tokens: int, max_running: int, baseline_tree: Path | None = None
) -> Stack:
    config = ClusterConfig(
        workers=workers,
        worker_speedup=speedup,
        worker_kv_tokens=kv_tokens,
        model_name=MODEL,
        http_port=0,
        log_level="WARNING",
        extra_worker_args=("--max-running-requests", str(max_running), "--log-level", "WARNING"),
        # One client opens every program: the per-client new-program rate (50/s, burst 200) would answer
        # a 256-stream phase's first turns with 429 (each router process has its own bucket).
        router_args=("--client-new-programs-per-second", "0"),
    )
    cluster = start_cluster(config, Supervisor())
    sglang = None
    try:
        nosched_spec = router_spec(config, cluster.capacity.endpoint, None)
        nosched_spec.name = "router-nosched"  # the supervisor names ready and log files after the child
        (nosched,) = cluster.supervisor.start_all([nosched_spec])
        nosched_url = f"http://127.0.0.1:{nosched.ready['http_port']}"
        twoproc_spec = router_spec(
            replace(config, router_processes=2), cluster.capacity.endpoint, cluster.scheduler.endpoint
        )
        twoproc_spec.name = "router-2proc"
        (twoproc,) = cluster.supervisor.start_all([twoproc_spec])
        twoproc_url = f"http://127.0.0.1:{twoproc.ready['http_port']}"
        baseline: list[subprocess.Popen] = []
        baseline_ready: dict[str, dict] = {}
        if baseline_tree is not None:
            for arm, scheduler in (("baseline", cluster.scheduler.endpoint), ("baseline-nosched", None)):
                # The ports of the cluster's own router are taken: any free ones.
                spec = router_spec(replace(config, http_port=0), cluster.capacity.endpoint, scheduler)
                args = list(spec.args)
                for flag in ("--listen", "--metrics-port"):
                    args[args.index(flag) + 1] = "127.0.0.1:0" if flag == "--listen" else "0"
                spec.args = args
                process, baseline_ready[arm] = start_baseline_router(
                    baseline_tree, spec, cluster.supervisor.state_dir, f"router-{arm}"
                )
                baseline.append(process)
        sglang, sglang_url = launch_sglang_router(
            cluster.workers, "cache_aware", cluster.supervisor.state_dir / "sglang-router.log"
        )
        baseline_urls = {arm: f"http://127.0.0.1:{ready['http_port']}" for arm, ready in baseline_ready.items()}
        # Every front door must answer a chat request before any phase starts: sglang-router registers
        # its workers in the background, our routers learn them from the capacity watch.
        deadline = time.monotonic() + 60
        pending = {cluster.http_url, nosched_url, twoproc_url, sglang_url, *baseline_urls.values()}
        while pending:
            if sglang.poll() is not None:
                raise RuntimeError(
                    f"sglang-router exited during start-up; see {cluster.supervisor.state_dir / 'sglang-router.log'}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"never routed a request: {sorted(pending)}")
            pending = {url for url in pending if not chat_ok(url, MODEL)}
            time.sleep(0.2)
    except BaseException:
        if sglang is not None and sglang.poll() is None:
            sglang.kill()
            sglang.wait()
        for process in locals().get("baseline", []):
            stop_process(process)
        cluster.stop()
        raise
    children = {child.spec.name: child.process.pid for child in cluster.supervisor.children}
    ready = {child.spec.name: child.ready for child in cluster.supervisor.children}
    pids = {
        "workers": [pid for name, pid in children.items() if name.startswith("simworker")],
        "capacity": [children["capacity"]],
        "scheduler": [children["scheduler"]],
        "router": [children["router"]],
        "router-nosched": [children["router-nosched"]],
        "router-2proc": [children["router-2proc"], *ready["router-2proc"]["processes"]],
        "sglang-router": [sglang.pid],
        "client": [os.getpid()],
        **{f"router-{arm}": [process.pid] for arm, process in zip(baseline_ready, baseline)},
    }
    metrics_urls = {
        arm: f"http://127.0.0.1:{ready[name]['metrics_port']}"
        for arm, name in (
            ("bandmaster", "router"),
            ("bandmaster-nosched", "router-nosched"),
            ("bandmaster-2proc", "router-2proc"),
        )
    }
    metrics_urls |= {arm: f"http://127.0.0.1:{ready['metrics_port']}" for arm, ready in baseline_ready.items()}
    return Stack(cluster, nosched_url, twoproc_url, sglang, sglang_url, pids, metrics_urls, baseline_urls, baseline)


# ---------------------------------------------------------------------------------------- report

# Processes that only the arm's own proxy path uses (the others idle during its phases).
PROXY_CPU_GROUPS = {
    "direct": (),
    "bandmaster": ("router", "scheduler"),
    "bandmaster-nosched": ("router-nosched",),
    "bandmaster-2proc": ("router-2proc", "scheduler"),
    "sglang-router": ("sglang-router",),
    "baseline": ("router-baseline", "scheduler"),
    "baseline-nosched": ("router-baseline-nosched",),
}


def phase_order(repeats: int, concurrencies: list[int], arms: tuple[str, ...] = ARMS) -> list[tuple[int, int, str]]:
    """(rep, concurrency, arm): per repetition each concurrency runs every arm, alternating direction."""
    order = []
    for rep in range(repeats):
        for position, concurrency in enumerate(concurrencies):
            # Each concurrency alternates ABCD / DCBA from one repetition to the next.
            ordered = tuple(reversed(arms)) if (rep + position) % 2 else arms
            order += [(rep, concurrency, arm) for arm in ordered]
    return order


def aggregate(
    phases: list[dict],
    ttft_samples: dict[tuple[int, str], list[float]],
    concurrencies: list[int],
    arms: tuple[str, ...] = ARMS,
) -> dict:
    """Per concurrency and arm: pooled TTFT percentiles, mean rates over repetitions, deltas and ratios."""
    out: dict[str, dict] = {}
    for concurrency in concurrencies:
        rows: dict[str, dict] = {}
        for arm in arms:
            mine = [p for p in phases if p["arm"] == arm and p["concurrency"] == concurrency]
            tokens = sum(p["tokens"] for p in mine)
            window = sum(p["window_s"] for p in mine)
            proxy_cpu = sum(sum(p["cpu_s"][g] for g in PROXY_CPU_GROUPS[arm]) for p in mine)
            tokens_all = sum(p["tokens_all"] for p in mine)
            rows[arm] = {
                "ttft_ms": summary_ms(ttft_samples[(concurrency, arm)]),
                "streamed_tokens_per_s": tokens / window,
                "streamed_tokens_per_s_by_repeat": [round(p["streamed_tokens_per_s"], 1) for p in mine],
                "requests_per_s": sum(p["requests"] for p in mine) / window,
                "requests": sum(p["requests"] for p in mine),
                "errors": sum(p["errors"] for p in mine),
                # CPU of the arm's own proxy processes (router + scheduler for bandmaster) per streamed token.
                "proxy_cpu_ms_per_1k_tokens": 1e6 * proxy_cpu / tokens_all if tokens_all else float("nan"),
                "client_cpu_fraction": sum(p["cpu_s"]["client"] for p in mine) / window,
                "busiest_worker_share": max(max(p["worker_share"]) for p in mine),
            }
            if arm in PROXY_METRICS_ARMS:
                router = [p["router"] for p in mine]
                rows[arm]["router"] = {
                    "fail_open": sum(r["fail_open"] for r in router),
                    "fail_open_by_reason": merge_counts(r["fail_open_by_reason"] for r in router),
                    "deadline_extended": sum(r["deadline_extended"] for r in router),
                    "loop_lag_p99_s": max(r["loop_lag_p99_s"] for r in router),
                    "loop_lag_samples": sum(r["loop_lag_samples"] for r in router),
                }
        for row in rows.values():
            for base in ("direct", "sglang-router"):
                if base not in rows:
                    continue
                ref = rows[base]
                row[f"vs_{base}"] = {
                    "added_ttft_ms_p50": row["ttft_ms"]["p50"] - ref["ttft_ms"]["p50"],
                    "added_ttft_ms_p99": row["ttft_ms"]["p99"] - ref["ttft_ms"]["p99"],
                    "ttft_p50_ratio": ratio(row["ttft_ms"]["p50"], ref["ttft_ms"]["p50"]),
                    "ttft_p99_ratio": ratio(row["ttft_ms"]["p99"], ref["ttft_ms"]["p99"]),
                    "tokens_per_s_ratio": ratio(row["streamed_tokens_per_s"], ref["streamed_tokens_per_s"]),
                }
        out[str(concurrency)] = rows
    return out


PROXY_METRICS_ARMS = ("bandmaster", "bandmaster-nosched", "bandmaster-2proc", *BASELINE_ARMS)
"""Arms whose router's /metrics are read around each phase."""


def merge_counts(counts) -> dict[str, float]:
    out: dict[str, float] = {}
    for one in counts:
        for key, value in one.items():
            out[key] = out.get(key, 0.0) + value
    return out


def router_phase(before: dict[str, float], after: dict[str, float]) -> dict:
    """What one phase did to a router's counters."""
    delta = {key: after[key] - before.get(key, 0.0) for key in after}
    by_reason = {k.split(":", 1)[1]: v for k, v in delta.items() if k.startswith("fail_open:") and v}
    lag = {k: v for k, v in delta.items() if k.startswith("lag_le:")}
    return {
        "fail_open": sum(by_reason.values()),
        "fail_open_by_reason": by_reason,
        "deadline_extended": delta.get("deadline_extended", 0.0),
        "loop_lag_p99_s": lag_p99_s(lag),
        "loop_lag_samples": lag.get("lag_le:+Inf", 0.0),
    }


def targets(summary: dict) -> dict:
    """Issue 20's router targets against this run (None where the run lacks the concurrency or arm)."""
    out: dict[str, dict] = {}
    at64 = summary.get("64", {})
    if "bandmaster" in at64 and "direct" in at64:
        added = at64["bandmaster"]["vs_direct"]["added_ttft_ms_p50"]
        out["added_ttft_p50_ms_at_64"] = {"target": "<= 10", "value": round(added, 1), "met": added <= 10}
    if "bandmaster" in at64 and "sglang-router" in at64:
        cpu = ratio(
            at64["bandmaster"]["proxy_cpu_ms_per_1k_tokens"], at64["sglang-router"]["proxy_cpu_ms_per_1k_tokens"]
        )
        out["cpu_per_token_vs_sglang_router_at_64"] = {"target": "<= 1.0", "value": round(cpu, 2), "met": cpu <= 1.0}
    at256 = summary.get("256", {})
    for arm in ("bandmaster", "bandmaster-2proc"):
        if arm in at256:
            router = at256[arm]["router"]
            # The scheduler is up throughout the bench: every turn that failed open did so through the
            # router's own lateness (a missed window, or a breaker such a miss opened).
            failed = sum(router["fail_open_by_reason"].values())
            out[f"{arm}_fail_open_at_256"] = {"target": "0", "value": failed, "met": failed == 0}
            lag = router["loop_lag_p99_s"]
            out[f"{arm}_loop_lag_p99_s_at_256"] = {"target": "<= 0.1", "value": lag, "met": lag <= 0.1}
    return out


def print_table(summary: dict) -> None:
    header = (
        f"{'conc':>4} {'arm':19} {'TTFT p50':>9} {'p99':>8} {'+p50 vs dir':>11} {'+p99 vs dir':>11} "
        f"{'tok/s':>8} {'req/s':>7} {'tok/s÷dir':>9} {'tok/s÷sgl':>9} {'p50÷sgl':>7} {'cpu/1k':>6} {'errors':>6}"
    )
    print(header)
    print("-" * len(header))
    nan = {"added_ttft_ms_p50": float("nan"), "added_ttft_ms_p99": float("nan")}
    nan |= {"tokens_per_s_ratio": float("nan"), "ttft_p50_ratio": float("nan")}
    for concurrency, rows in summary.items():
        for arm, r in rows.items():
            direct, sgl = r.get("vs_direct", nan), r.get("vs_sglang-router", nan)
            router = r.get("router")
            extra = f"  fail-open {router['fail_open']:.0f} lag p99 <= {router['loop_lag_p99_s']:g} s" if router else ""
            print(
                f"{concurrency:>4} {arm:19} {r['ttft_ms']['p50']:9.1f} {r['ttft_ms']['p99']:8.1f} "
                f"{direct['added_ttft_ms_p50']:+11.1f} {direct['added_ttft_ms_p99']:+11.1f} "
                f"{r['streamed_tokens_per_s']:8.0f} {r['requests_per_s']:7.1f} "
                f"{direct['tokens_per_s_ratio']:9.2f} {sgl['tokens_per_s_ratio']:9.2f} "
                f"{sgl['ttft_p50_ratio']:7.2f} {r['proxy_cpu_ms_per_1k_tokens']:6.0f} "
                f"{r['errors']:6d}{extra}"
            )
    print(
        "TTFT in ms (client send -> first content token); tok/s = streamed tokens per wall second;\n"
        "cpu/1k = CPU ms of the arm's proxy processes (router + scheduler for bandmaster) per 1000 streamed tokens;\n"
        "fail-open = turns the router let through without an admission; lag p99 = its event loop's (bucket bound)."
    )


# ---------------------------------------------------------------------------------------- main


async def run_phases(stack: Stack, order: list[tuple[int, int, str]], make_load) -> tuple[list[dict], dict]:
    phases: list[dict] = []
    ttft: dict[tuple[int, str], list[float]] = {}
    for index, (rep, concurrency, arm) in enumerate(order):
        load = make_load(concurrency)
        prefix = f"rb{os.getpid()}-{index}" if arm in SCHEDULED_ARMS else None
        metrics_url = stack.metrics_urls.get(arm)
        counters0 = router_counters(metrics_url) if metrics_url else {}
        cpu0 = stack.cpu()
        served0 = [worker_requests(url) for url in stack.cluster.workers]
        stats, window_s = await run_phase(stack.urls(arm), load, prefix)
        cpu1 = stack.cpu()
        router = router_phase(counters0, router_counters(metrics_url)) if metrics_url else None
        served = [worker_requests(url) - before for url, before in zip(stack.cluster.workers, served0)]
        ttft.setdefault((concurrency, arm), []).extend(stats.ttft_s)
        phase = {
            "index": index,
            "repeat": rep,
            "concurrency": concurrency,
            "arm": arm,
            "window_s": round(window_s, 3),
            "requests": stats.requests,
            "tokens": stats.tokens,
            "tokens_all": stats.tokens_all,
            "errors": stats.errors,
            "error_kinds": stats.error_kinds,
            "streamed_tokens_per_s": stats.tokens / window_s,
            "requests_per_s": stats.requests / window_s,
            "ttft_ms": summary_ms(stats.ttft_s),
            # Whole phase (warm-up and drain included), per process group.
            "cpu_s": {group: round(cpu1[group] - cpu0[group], 3) for group in cpu0},
            # Share of the phase's requests each worker served (the routing balance of the arm).
            "worker_share": [round(n / sum(served), 3) if sum(served) else float("nan") for n in served],
        }
        if router is not None:
            phase["router"] = router
        phases.append(phase)
        print(
            f"  [{index + 1}/{len(order)}] c={concurrency:<4} {arm:19} ttft p50 {phase['ttft_ms']['p50']:7.1f} ms "
            f"p99 {phase['ttft_ms']['p99']:7.1f} ms  {phase['streamed_tokens_per_s']:7.0f} tok/s  "
            f"errors {stats.errors}  workers {'/'.join(f'{x:.2f}' for x in phase['worker_share'])}"
            + (f"  fail-open {router['fail_open']:.0f} lag p99 <= {router['loop_lag_p99_s']:g} s" if router else ""),
            flush=True,
        )
    return phases, ttft


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.router_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/router_bench.json")
    parser.add_argument("--smoke", action="store_true", help="seconds, not minutes: for the test suite")
    parser.add_argument("--concurrency", default=None, help="comma-separated stream counts (default 64,256)")
    parser.add_argument("--duration-s", type=float, default=None, help="measured window per phase")
    parser.add_argument("--warmup-s", type=float, default=None, help="unmeasured start of each phase")
    parser.add_argument("--repeats", type=int, default=None, help="passes over all arms (alternating order)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--speedup", type=float, default=1000.0)
    parser.add_argument("--prompt-tokens", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument(
        "--arms", default=",".join(ARMS), help=f"comma-separated arms to run (default all: {','.join(ARMS)})"
    )
    parser.add_argument(
        "--baseline-ref",
        default="",
        help="git commit whose router also runs, as the arms baseline (scheduled) and baseline-nosched",
    )
    args = parser.parse_args(argv)
    arms = tuple(arm.strip() for arm in args.arms.split(",") if arm.strip())
    if args.baseline_ref and args.arms == parser.get_default("arms"):
        arms += BASELINE_ARMS
    known = ARMS + (BASELINE_ARMS if args.baseline_ref else ())
    unknown = sorted(set(arms) - set(known))
    if unknown or not arms:
        parser.error(f"--arms: unknown arm(s) {unknown}; choose from {','.join(known)}")
    concurrencies = [int(c) for c in (args.concurrency or ("8" if args.smoke else "64,256")).split(",")]
    duration_s = args.duration_s or (1.0 if args.smoke else 8.0)
    warmup_s = args.warmup_s if args.warmup_s is not None else (0.5 if args.smoke else 2.0)
    repeats = args.repeats or (1 if args.smoke else 3)
    prompt_tokens = args.prompt_tokens or (64 if args.smoke else 256)
    max_tokens = args.max_tokens or (16 if args.smoke else 64)
    max_concurrency = max(concurrencies)
    # Every stream holds prompt + output tokens; KV is sized so that nothing queues or pauses on it.
    kv_tokens = max(65_536, 4 * max_concurrency * (prompt_tokens + max_tokens + 32))
    max_running = max(256, max_concurrency)
    order = phase_order(repeats, concurrencies, arms)

    def make_load(concurrency: int) -> Load:
        return Load(concurrency, prompt_tokens, max_tokens, warmup_s, duration_s)

    print(
        f"router bench: {args.workers} simworkers at speedup {args.speedup:g}, prompt ~{prompt_tokens} tokens, "
        f"{max_tokens} tokens/request; {len(order)} phases of {warmup_s:g}+{duration_s:g} s",
        flush=True,
    )
    started = time.monotonic()
    baseline_commit = ""
    with tempfile.TemporaryDirectory(prefix="router-bench-baseline-") as tree:
        if args.baseline_ref:
            baseline_commit = checkout(args.baseline_ref, Path(tree))
            print(f"baseline arms: the router of {baseline_commit}", flush=True)
        stack = start_stack(
            args.workers, args.speedup, kv_tokens, max_running, Path(tree) if args.baseline_ref else None
        )
        try:
            phases, ttft = asyncio.run(run_phases(stack, order, make_load))
            failed = [c.spec.name for c in stack.cluster.supervisor.failed()] + (
                ["sglang-router"] if stack.sglang.poll() is not None else []
            )
            failed += [f"router-{arm}" for arm, p in zip(BASELINE_ARMS, stack.baseline) if p.poll() is not None]
        finally:
            stack.stop()
    summary = aggregate(phases, ttft, concurrencies, arms)
    report = {
        "benchmark": "router_bench",
        "smoke": args.smoke,
        "machine": machine(note="client, proxies and workers share these CPUs; compare ratios within one run"),
        "config": {
            "workers": args.workers,
            "speedup": args.speedup,
            "prompt_tokens": prompt_tokens,
            "max_tokens": max_tokens,
            "concurrency": concurrencies,
            "duration_s": duration_s,
            "warmup_s": warmup_s,
            "repeats": repeats,
            "arms": list(arms),
            "baseline_commit": baseline_commit,
            "worker_kv_tokens": kv_tokens,
            "worker_max_running_requests": max_running,
            "sglang_router_policy": "cache_aware",
            "order": [f"{c}:{arm}" for _, c, arm in order],
        },
        "wall_s": round(time.monotonic() - started, 1),
        "processes_exited_early": failed,
        "summary": summary,
        "targets": targets(summary),
        "phases": phases,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print()
    print_table(summary)
    for name, target in report["targets"].items():
        print(f"target {name}: {target['value']} (target {target['target']}): {'met' if target['met'] else 'MISSED'}")
    print(f"report written to {out} ({report['wall_s']:.0f} s)")
    errors = sum(p["errors"] for p in phases)
    empty = [p for p in phases if p["requests"] == 0]
    return 0 if errors == 0 and not empty and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
