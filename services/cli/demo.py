"""`bandmaster demo`: start the local cluster, show what it sees, stop everything."""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import time
from dataclasses import dataclass

from bandmaster.capacity.v1 import capacity_pb2
from services.cli.up import add_cluster_arguments, cluster_config
from services.common.observe.logs import setup_logging
from services.launcher.cluster import start_cluster
from services.launcher.probes import (
    STARVED_CPU_BUSY,
    STARVED_LATE_FRACTION,
    busy_share,
    cpu_times,
    scheduler_counts,
    starved,
    wait_for_workers,
    worker_late_s,
)
from services.launcher.supervisor import StartupError
from services.launcher.table import render_table

ARMS = {"bandmaster": "Bandmaster", "kv": "KV routing only"}


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "demo",
        help="run Bandmaster and KV-only routing side by side on a local cluster, print both and the ratio, stop",
    )
    add_cluster_arguments(parser)
    parser.add_argument("--programs", type=int, default=18, help="agent programs to run, all in parallel")
    parser.add_argument("--max-turns", type=int, default=32, help="turns per program (the trace's first turns)")
    parser.add_argument("--token-scale", type=float, default=1.0, help="scale the trace's token counts")
    parser.add_argument("--workload", default="swe", choices=("swe", "synthetic", "short"))
    parser.add_argument(
        "--arms",
        default="bandmaster,kv",
        help="comma-separated arms, run one after the other on fresh clusters: "
        "bandmaster (scheduler on), kv (bandmaster up --no-scheduler)",
    )
    parser.add_argument(
        "--no-predict",
        dest="predict",
        action="store_false",
        help="skip the offline simulator's prediction of the same runs",
    )
    parser.add_argument(
        "--predict-draws",
        type=_draw_count,
        default=PREDICT_DRAWS,
        help="simulate each arm this many times, each with other draws of the router's tie-breaks, and predict "
        "the median: one run is one draw of which programs the scheduler pauses when, as one live run is",
    )
    parser.set_defaults(run=run, worker_speedup=10.0, worker_kv_tokens=65_536, http_port=0, log_level="WARNING")


PREDICT_DRAWS = 5
"""Simulated runs per arm the prediction takes the median of (about 1.3 CPU seconds each at the demo's size)."""


def _draw_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 50:
        raise argparse.ArgumentTypeError(f"must be an integer from 1 to 50, got {text!r}")
    return value


@dataclass(frozen=True)
class Prediction:
    """One arm's simulated steps/min, one per draw."""

    steps_per_min: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.steps_per_min)


def capacity_table(snapshot: capacity_pb2.WorkersSnapshot) -> str:
    rows = []
    for worker in snapshot.workers:
        health = capacity_pb2.WorkerHealth.Name(worker.health).removeprefix("WORKER_HEALTH_")
        if not worker.replicas:
            rows.append([worker.worker_id, "-", health, 0, 0, 0, "-", worker.excluded_reason or "-"])
        for replica in worker.replicas:
            source = capacity_pb2.RetentionSource.Name(replica.retention_source).removeprefix("RETENTION_SOURCE_")
            rows.append(
                [
                    worker.worker_id,
                    replica.dp_rank,
                    health,
                    replica.gpu_kv_tokens,
                    replica.host_kv_tokens,
                    replica.retention_tokens,
                    source,
                    worker.excluded_reason or "-",
                ]
            )
    return render_table(
        ["worker", "dp", "health", "gpu_kv_tokens", "host_kv_tokens", "retention_tokens", "source", "excluded"],
        rows,
        title=f"Capacity snapshot v{snapshot.version}: {snapshot.total_retention_tokens:,} retention tokens",
    )


def demo_programs(args: argparse.Namespace):
    from clients.player import build_workload

    return build_workload(
        args.workload,
        args.programs,
        seed=0,
        max_turns=args.max_turns,
        token_scale=args.token_scale,
        tool_time_scale=1.0,
    )


async def _run_workload(args: argparse.Namespace, cluster, arm: str) -> dict:
    from clients.player import Runner, scrape_counters
    from clients.progress import ProgressBar

    programs = demo_programs(args)
    progress = ProgressBar(sum(len(p.turns) for p in programs), label=f"{arm} turns")
    runner = Runner(
        cluster.http_url + "/v1", args.model_name, time_scale=args.worker_speedup, progress=progress, arm=arm
    )
    before = await scrape_counters(cluster.workers)
    late_before = await worker_late_s(cluster.workers)
    cpu_before = cpu_times()
    started = time.monotonic()
    result = await runner.run(programs, len(programs))
    elapsed = time.monotonic() - started
    cpu_busy = busy_share(cpu_before, cpu_times())
    progress.close()
    after = await scrape_counters(cluster.workers)
    late_after = await worker_late_s(cluster.workers)
    result.worker_counters = {k: after[k] - before[k] for k in after}
    summary = result.summary()
    summary.update(scheduler_counts(cluster))
    # The worst worker's lag behind its simulated clock, as a share of the run's wall time.
    lags = [late_after[url] - late_before[url] for url in late_after if url in late_before]
    summary["late_fraction"] = max(lags) / elapsed if lags and elapsed > 0 else None
    summary["cpu_busy"] = cpu_busy
    return summary


SIMULATOR_MISSING = (
    "(No simulator prediction: the offline simulator is a development tool that a runtime install does not carry; "
    "run the demo from a checkout of the repository (make demo) for it.)"
)


def predict(args: argparse.Namespace, arms: list[str]) -> dict[str, Prediction] | None:
    """The offline simulator's steps/min for the same runs (harness/simlib, modelling this live stack),
    under `--predict-draws` draws of its randomness per arm (`SimScenario.variant`: the router's
    tie-breaks, the new-message texts and each turn's live-path costs, which vary about their means; the
    workload stays that of seed 0, as the live run's), or None when the cluster is not the simulated one
    it models.

    Why several draws: a run's throughput hangs on a few control decisions (at the demo's size about 40
    pauses, each holding a program for about two simulated minutes), and which programs they hit moves
    with small differences in timing, such as a turn's path costing a few milliseconds more or less than
    its mean. One simulation is one draw of those, as one live run is. At the demo's defaults the path's
    mean costs alone give Bandmaster 40.6 steps/min, where draws 1-6 give 41.6-44.4 (median of draws
    1-5: 42.8; kv 34.8-35.8, median 35.2); live runs of the Bandmaster arm measured 44.0-44.9."""
    if args.worker_urls or args.scheduler_args or args.router_args or args.worker_host_kv_tokens or args.tokenizer:
        return None
    try:
        from harness.simlib import SimScenario, live_control_params, simulate
        from harness.simlib.live_path import LivePathCosts
    except ModuleNotFoundError as exc:
        if exc.name != "harness" and not (exc.name or "").startswith("harness."):
            raise
        # The simulator is a development tool (a checkout's harness/), not installed with the product.
        print(SIMULATOR_MISSING, flush=True)
        return None

    print(f"Predicting both runs with the offline simulator ({args.predict_draws} draws per arm) ...", flush=True)

    def steps_per_min(arm: str, variant: int) -> float:
        scenario = SimScenario(
            arm=arm,
            workload=args.workload,
            programs=args.programs,
            max_turns=args.max_turns,
            token_scale=args.token_scale,
            seed=0,
            variant=variant,
            workers=args.workers,
            worker_kv_tokens=args.worker_kv_tokens,
            worker_page_size=args.worker_page_size,
            control=live_control_params(args.worker_speedup),
            live_speedup=args.worker_speedup,
            router_prompt="text",
            # The live stack's own per-turn costs (client, router, scheduler round trip, worker front end,
            # relay), measured and counted `worker_speedup` times, as the live run pays them.
            live_path=LivePathCosts(),
        )
        return simulate(scenario).summary()["steps_per_min"]

    return {arm: Prediction(tuple(steps_per_min(arm, v) for v in range(1, args.predict_draws + 1))) for arm in arms}


ROWS = [
    ("programs done", lambda s: f"{s['programs_done']} / {s['programs_total']}", None),
    ("turns ok / failed", lambda s: f"{s['turns_ok']} / {s['turns_failed']}", None),
    ("steps per minute", lambda s: f"{s['steps_per_min']:.1f}", "steps_per_min"),
    ("program time p50 / p90", lambda s: f"{s['program_time_p50_s']:.0f} s / {s['program_time_p90_s']:.0f} s", None),
    ("time to first token p50 / p90", lambda s: f"{s['ttft_p50_s']:.2f} s / {s['ttft_p90_s']:.2f} s", None),
    ("KV hit rate", lambda s: f"{s['kv_hit_rate']:.1%}", None),
    ("recomputed tokens (workers)", lambda s: f"{int(s.get('worker_recomputed_tokens', 0)):,}", None),
    ("pauses / resumes", lambda s: f"{s.get('pauses', 0)} / {s.get('resumes', 0)}" if "pauses" in s else "-", None),
    (
        "workers behind their clock",
        lambda s: "-" if s.get("late_fraction") is None else f"{s['late_fraction']:.1%}",
        None,
    ),
    ("machine CPU busy (all cores)", lambda s: "-" if s.get("cpu_busy") is None else f"{s['cpu_busy']:.0%}", None),
]


def results_table(summaries: dict[str, dict]) -> str:
    arms = list(summaries)
    ratio = len(arms) == 2
    headers = ["result", *(ARMS[a] for a in arms)] + (["ratio"] if ratio else [])
    rows = []
    for label, show, key in ROWS:
        row = [label, *(show(summaries[a]) for a in arms)]
        if ratio:
            first, second = (summaries[a].get(key) if key else None for a in arms)
            row.append(f"{first / second:.2f}x" if key and first and second else "")
        rows.append(row)
    return render_table(headers, rows, title="Results (times in simulated seconds of the modelled hardware)")


def verdict(summaries: dict[str, dict], predicted: dict[str, Prediction] | None) -> list[str]:
    """The lines under the table: the ratio, the simulator's prediction, and a warning when the
    machine could not keep the simulated workers on their clock."""
    lines = []
    if set(summaries) == {"bandmaster", "kv"} and summaries["kv"]["steps_per_min"] > 0:
        live = summaries["bandmaster"]["steps_per_min"] / summaries["kv"]["steps_per_min"]
        lines.append(f"Bandmaster ran {live:.2f}x the steps per minute of KV-aware routing alone.")
        if predicted and "bandmaster" in predicted and "kv" in predicted and predicted["kv"].median > 0:
            bandmaster, kv = predicted["bandmaster"], predicted["kv"]
            sim = bandmaster.median / kv.median
            draws = len(bandmaster.steps_per_min)
            spread = (
                f"medians of {draws} draws; Bandmaster {min(bandmaster.steps_per_min):.1f}-"
                f"{max(bandmaster.steps_per_min):.1f}, KV {min(kv.steps_per_min):.1f}-{max(kv.steps_per_min):.1f}"
                if draws > 1
                else "one draw"
            )
            lines.append(
                f"The offline simulator predicts {sim:.2f}x for the same runs "
                f"({bandmaster.median:.1f} vs {kv.median:.1f} steps/min, {spread}; "
                f"make bench-agentic measures many more)."
            )
    hungry = [ARMS[a] for a, s in summaries.items() if starved(s)]
    if hungry:
        lines.append(
            f"WARNING: this machine was CPU-starved during the {' and '.join(hungry)} "
            f"run{'s' if len(hungry) > 1 else ''} (its cores were more than {STARVED_CPU_BUSY:.0%} busy, or "
            f"the simulated workers fell more than {STARVED_LATE_FRACTION:.0%} of the time behind their "
            f"clock), so these figures measure the machine more than the scheduling. Re-run on an idle "
            f"machine or with a lower --speedup."
        )
    return lines


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    arms = ["kv"] if args.no_scheduler else [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if not arms or unknown or len(set(arms)) != len(arms):
        print(
            f"bandmaster demo: --arms takes distinct names from {', '.join(ARMS)} (got {args.arms!r})", file=sys.stderr
        )
        return 2
    programs = demo_programs(args)
    print(
        f"Workload: {len(programs)} real SWE-agent programs ({args.workload}, up to {args.max_turns} turns each, "
        f"{sum(len(p.turns) for p in programs)} turns), all in parallel, on {args.workers} simulated workers of "
        f"{args.worker_kv_tokens:,} KV tokens running {args.worker_speedup:g}x faster than the modelled hardware.",
        flush=True,
    )
    predicted = predict(args, arms) if args.predict else None
    summaries: dict[str, dict] = {}
    for arm in arms:
        code = run_arm(args, arm, summaries)
        if code:
            return code
    print()
    print(results_table(summaries))
    for line in verdict(summaries, predicted):
        print(line)
    failed = any(s["turns_failed"] or s["programs_done"] != s["programs_total"] for s in summaries.values())
    return 1 if failed else 0


def run_arm(args: argparse.Namespace, arm: str, summaries: dict[str, dict]) -> int:
    config = cluster_config(args, scheduler=arm == "bandmaster")
    what = "capacity, scheduler and router" if config.scheduler else "capacity and router (no scheduler)"
    print(f"\n[{ARMS[arm]}] starting a local cluster: {config.workers} simulated workers, {what} ...", flush=True)
    try:
        cluster = start_cluster(config)
    except StartupError as exc:
        print(f"bandmaster demo: {exc}", file=sys.stderr)
        return 1
    finished = False
    try:
        print(render_table(["process", "endpoint"], cluster.endpoints()))
        assert cluster.capacity is not None  # start_cluster always starts the capacity service
        snapshot = wait_for_workers(cluster.capacity.endpoint, len(cluster.workers))
        if len(summaries) == 0:
            print()
            print(capacity_table(snapshot))
        healthy = sum(1 for w in snapshot.workers if w.health == capacity_pb2.WORKER_HEALTH_HEALTHY)
        if healthy < len(cluster.workers):
            print(f"bandmaster demo: only {healthy} of {len(cluster.workers)} workers became healthy", file=sys.stderr)
            return 1
        print(f"[{ARMS[arm]}] running the programs through {cluster.http_url}/v1 ...", flush=True)
        summaries[arm] = asyncio.run(_run_workload(args, cluster, arm))
        finished = True
        return 0
    finally:
        cluster.stop()
        state_dir = cluster.supervisor.state_dir
        if finished and args.state_dir is None:
            # The demo made it: it goes with the cluster (after a failure it stays, for its logs).
            shutil.rmtree(state_dir, ignore_errors=True)
            print(f"[{ARMS[arm]}] cluster stopped.", flush=True)
        else:
            print(f"[{ARMS[arm]}] cluster stopped. Its logs are in {state_dir}", flush=True)
