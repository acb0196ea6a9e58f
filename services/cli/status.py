"""`bandmaster status`: a live view of the cluster in the terminal, refreshed every `--interval-seconds`
until Ctrl-C (`--once`: one snapshot).

What it shows, and where it comes from (the cluster is found as services/cli/endpoints.py says):
workers, their health and retention budgets (capacity `ListWorkers`), and loudly each worker whose server
arguments make Bandmaster know less (its card's degradations, with the SGLang flag to add); per replica the
working set against the budget as a bar with the resume / soft-demote / pause band edges marked, and its band (scheduler
`ListPrograms`); programs by state (scheduler `GetStats` and the program table); the drain lease and the
replica target (planner `GetPlan`); the batch service's gRPC health (`grpc.health.v1`, one cheap call).
The band edges are those in force at the scheduler, read from its
`bandmaster_scheduler_band_threshold_ratio` series; when its metrics port cannot be read the reference
defaults are drawn and the view says so. A part whose service does not answer says why; the rest is shown.
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Callable, Mapping

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bandmaster.capacity.v1 import capacity_pb2, capacity_pb2_grpc
from bandmaster.planner.v1 import planner_pb2, planner_pb2_grpc
from bandmaster.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.cli import endpoints
from services.common.serve.ports import DEFAULT_PORTS
from services.common.settings.config import parse_host_port
from services.launcher.table import render_table

BAR_CELLS = 50
_BAND = {
    scheduler_pb2.BAND_NORMAL: "normal",
    scheduler_pb2.BAND_SOFT_DEMOTE: "soft-demote",
    scheduler_pb2.BAND_PAUSE: "pause",
}
_CLEAR = "\x1b[H\x1b[2J"


@dataclass(frozen=True)
class Bands:
    """Utilisation fractions at the band edges: paused programs resume below `resume`; soft-demotion starts
    at `soft_demote`; a pause cycle starts at `pause`."""

    pause: float = 0.95
    soft_demote: float = 0.80
    resume: float = 0.85
    source: str = "reference defaults"


REFERENCE_BANDS = Bands()


def parse_bands(metrics_text: str, source: str) -> Bands | None:
    """The band edges from a scheduler's Prometheus text (None when the series is absent)."""
    found: dict[str, float] = {}
    for line in metrics_text.splitlines():
        if not line.startswith("bandmaster_scheduler_band_threshold_ratio{"):
            continue
        labels, _, value = line.rpartition(" ")
        for band in ("pause", "soft_demote", "resume"):
            if f'band="{band}"' in labels:
                try:
                    found[band] = float(value)
                except ValueError:
                    pass
    if set(found) != {"pause", "soft_demote", "resume"}:
        return None
    return Bands(found["pause"], found["soft_demote"], found["resume"], source)


def bar(utilization: float, bands: Bands, cells: int = BAR_CELLS) -> str:
    """`[#####...r...s..P]`: `#` for the used share of the budget, the band edges marked `r` (resume),
    `s` (soft-demote) and `P` (pause) at their fractions; `>` after the bar when over 100 %."""
    filled = max(0, min(cells, round(utilization * cells)))
    row = ["#"] * filled + ["."] * (cells - filled)
    for mark, edge in (("r", bands.resume), ("s", bands.soft_demote), ("P", bands.pause)):
        if 0.0 <= edge <= 1.0:
            row[min(cells - 1, int(edge * cells))] = mark
    return "[" + "".join(row) + "]" + (">" if utilization > 1.0 else "")


@dataclass
class Snapshot:
    """One read of the cluster; a part that could not be read is None with its error."""

    workers: capacity_pb2.WorkersSnapshot | None = None
    workers_error: str = ""
    programs: scheduler_pb2.ListProgramsResponse | None = None
    stats: scheduler_pb2.Stats | None = None
    scheduler_error: str = ""
    plan: planner_pb2.Plan | None = None
    planner_error: str = ""
    batch_health: str = ""
    """The batch service's gRPC health status (SERVING, NOT_SERVING, ...) or why it could not be read."""
    bands: Bands = field(default_factory=Bands)
    taken_at: float = 0.0
    schedulers: list[tuple[str, str]] = field(default_factory=list)
    """(address, "leader" / "standby" (epoch N) / the error) of each scheduler replica, when there are several."""
    absent: dict[str, str] = field(default_factory=dict)
    """Service -> why it is not shown: the cluster does not run it (`--no-scheduler`, `--no-planner`)."""

    @property
    def reachable(self) -> bool:
        return self.workers is not None or self.programs is not None


DEGRADATION_ADVICE: dict[int, tuple[str, str, str]] = {
    capacity_pb2.DEGRADATION_CACHE_REPORT_OFF: (
        "cache reports off",
        "--enable-cache-report",
        "completions carry no cached-token counts, so the cost-aware policy cannot learn the prefill "
        "rate from this worker and keeps its prior (--cost-aware-prefill-tokens-per-s)",
    ),
    capacity_pb2.DEGRADATION_PRIORITY_SCHEDULING_OFF: (
        "priority scheduling off",
        "--enable-priority-scheduling",
        "the engine ignores the priorities Bandmaster sends (resumed turns first, soft-demoted turns last)",
    ),
}
"""Per capacity.v1 Degradation: a short name, the SGLang flag that ends it, and what is lost meanwhile."""


def degraded_workers(snapshot: capacity_pb2.WorkersSnapshot) -> list[tuple[str, list[int]]]:
    """(worker URL or id, its degradations) for each worker whose card has any, by worker id."""
    return [
        (w.url or w.worker_id, list(w.card.degraded))
        for w in sorted(snapshot.workers, key=lambda w: w.worker_id)
        if w.card.degraded
    ]


def degraded_banner(snapshot: capacity_pb2.WorkersSnapshot) -> str:
    """The loud warning naming each degraded worker, what is off and the flag to add ("" when none is)."""
    found = degraded_workers(snapshot)
    if not found:
        return ""
    rule = "!" * 78
    lines = [rule, f"DEGRADED: {len(found)} of {len(snapshot.workers)} workers run without what Bandmaster relies on."]
    for where, reasons in found:
        for reason in reasons:
            name, flag, loss = DEGRADATION_ADVICE.get(reason, (f"degradation {reason}", "?", "unknown to this CLI"))
            lines.append(f"  {where}: {name}; restart it with {flag}: {loss}")
    lines.append(rule)
    return "\n".join(lines)


def _degraded_note(worker: capacity_pb2.Worker) -> str:
    return ", ".join(DEGRADATION_ADVICE.get(d, (f"degradation {d}",))[0] for d in worker.card.degraded)


def _workers_table(snapshot: Snapshot) -> str:
    if snapshot.workers is None:
        return f"workers: capacity service not answering ({snapshot.workers_error})"
    rows = []
    for w in sorted(snapshot.workers.workers, key=lambda w: w.worker_id):
        health = capacity_pb2.WorkerHealth.Name(w.health).removeprefix("WORKER_HEALTH_").lower()
        budget = sum(r.retention_tokens for r in w.replicas)
        host = sum(r.host_kv_tokens for r in w.replicas)
        rows.append(
            [
                w.worker_id,
                w.url,
                health,
                w.card.model_name or "-",
                budget or "-",
                f"{host:,} host" if host else "GPU only",
                w.load.num_running_reqs,
                w.load.num_queue_reqs,
                "; ".join(note for note in (w.excluded_reason, _degraded_note(w)) if note),
            ]
        )
    healthy = sum(w.health == capacity_pb2.WORKER_HEALTH_HEALTHY for w in snapshot.workers.workers)
    title = (
        f"workers ({healthy} of {len(snapshot.workers.workers)} healthy, retention budget "
        f"{snapshot.workers.total_retention_tokens:,} tokens)"
    )
    table = render_table(
        ["worker", "url", "health", "model", "budget", "of which", "running", "queued", "note"], rows, title=title
    )
    if not healthy:
        table += "\n!! NO HEALTHY WORKER: requests fail with 503 until one is"
    banner = degraded_banner(snapshot.workers)
    if banner:
        table += "\n" + banner
    return table


def _replicas_table(snapshot: Snapshot) -> str:
    if "scheduler" in snapshot.absent:
        return f"utilisation: {snapshot.absent['scheduler']}"
    if snapshot.programs is None:
        return f"utilisation: scheduler not answering ({snapshot.scheduler_error})"
    bands = snapshot.bands
    rows = []
    for r in sorted(snapshot.programs.replicas, key=lambda r: (r.worker_id, r.dp_rank)):
        rows.append(
            [
                f"{r.worker_id}/{r.dp_rank}",
                bar(r.utilization, bands),
                f"{r.utilization:.1%}",
                _BAND.get(r.band, "?"),
                f"{r.used_decayed_tokens:,}/{r.retention_tokens:,}",
                r.active_programs,
                r.resident_programs,
            ]
        )
    legend = (
        f"bands ({bands.source}): r resume < {bands.resume:.0%}   s soft-demote >= {bands.soft_demote:.0%}   "
        f"P pause >= {bands.pause:.0%}"
    )
    return (
        render_table(
            ["replica", "working set / retention budget", "util", "band", "tokens", "in flight", "resident"],
            rows,
            title="utilisation",
        )
        + "\n"
        + legend
    )


def program_counts(programs) -> list[list]:
    """The program rows of the view, counted from one program table so that they nest: active splits into
    reasoning and acting, paused into held (its next turn waits for the resume) and idle.

    GetStats' `programs_reasoning` / `programs_acting` count every program, paused ones too, while its
    `programs_active` leaves the paused out: put under "active", reasoning could exceed it."""
    active = [p for p in programs if p.lifecycle != scheduler_pb2.LIFECYCLE_PAUSED]
    paused = [p for p in programs if p.lifecycle == scheduler_pb2.LIFECYCLE_PAUSED]
    reasoning = sum(p.status == scheduler_pb2.PROGRAM_STATUS_REASONING for p in active)
    held = sum(p.status == scheduler_pb2.PROGRAM_STATUS_REASONING for p in paused)
    return [
        ["active", len(active)],
        ["  reasoning (in a turn)", reasoning],
        ["  acting (at a tool call)", len(active) - reasoning],
        ["paused", len(paused)],
        ["  held (a turn waits for the resume)", held],
        ["  idle (at a tool call)", len(paused) - held],
        ["marked (pause at the next tool call)", sum(p.marked for p in programs)],
        ["soft-demoted", sum(p.soft_demoted for p in programs)],
    ]


def _programs_summary(snapshot: Snapshot) -> str:
    if "scheduler" in snapshot.absent:
        return f"programs: {snapshot.absent['scheduler']}"
    if snapshot.programs is None or snapshot.stats is None:
        return f"programs: scheduler not answering ({snapshot.scheduler_error})"
    s = snapshot.stats
    programs = snapshot.programs.programs
    rows = [
        *program_counts(programs),
        ["admissions waiting", s.waiting_admissions],
        ["passthrough in flight", s.passthrough_in_flight],
    ]
    totals = (
        f"since start: {s.admissions_total:,} admissions, {s.pauses_total:,} pauses, {s.resumes_total:,} "
        f"resumes ({s.forced_resumes_total:,} forced), {s.released_total:,} released, "
        f"{s.expired_total:,} expired"
    )
    return render_table(["programs", "count"], rows, title=f"programs ({len(programs)})") + "\n" + totals


def _lease_summary(snapshot: Snapshot) -> str:
    if "planner" in snapshot.absent:
        return f"leases: {snapshot.absent['planner']}"
    if snapshot.plan is None:
        return f"leases: planner not answering ({snapshot.planner_error})"
    plan = snapshot.plan
    rows = []
    for lease in plan.leases:
        left_s = lease.valid_until_unix_ms / 1000.0 - snapshot.taken_at if lease.valid_until_unix_ms else 0.0
        rows.append(
            [
                lease.pool_id or "default",
                f"{lease.max_admission_rps:g}",
                f"{max(0.0, left_s):.0f} s" if lease.valid_until_unix_ms else "-",
                lease.decision_id,
                f"{lease.writer_epoch}/{lease.writer_sequence}",
            ]
        )
    replicas = (
        ", ".join(
            part
            for part in (
                f"scaled to {plan.scale_to}" if plan.has_scale_to else "",
                f"idle target {plan.idle_target}" if plan.has_idle_target else "",
                f"floor {plan.replica_floor}" if plan.has_replica_floor else "",
            )
            if part
        )
        or "no scaling"
    )
    head = f"planner: last decision {plan.decision_id or '-'} ({plan.action or 'none yet'}), replicas: {replicas}"
    if plan.fail_closed_reasons:
        head += f", fail-closed: {', '.join(plan.fail_closed_reasons)}"
    return (
        render_table(
            ["pool", "batch admission rps", "valid for", "decision", "epoch/seq"],
            rows,
            title=f"drain leases ({len(rows)})",
        )
        + "\n"
        + head
    )


def _schedulers_line(snapshot: Snapshot) -> str:
    return "Scheduler replicas: " + "   ".join(f"{address} {role}" for address, role in snapshot.schedulers)


def render(snapshot: Snapshot, where: str = "") -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snapshot.taken_at)) if snapshot.taken_at else ""
    head = f"Bandmaster status  {stamp}" + (f"  ({where})" if where else "")
    return "\n\n".join(
        [
            head,
            _workers_table(snapshot),
            *([_schedulers_line(snapshot)] if snapshot.schedulers else []),
            _replicas_table(snapshot),
            _programs_summary(snapshot),
            _lease_summary(snapshot),
            *([f"batch service: {snapshot.batch_health}"] if snapshot.batch_health else []),
        ]
    )


# -- reading the cluster ----------------------------------------------------------------------------


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "status",
        help="a live view of the cluster: workers, budgets, utilisation bars "
        "with the bands, programs by state, leases (Ctrl-C to stop)",
    )
    parser.add_argument("--once", action="store_true", help="print one snapshot and exit (1 when nothing answered)")
    parser.add_argument("--interval-seconds", type=float, default=2.0, help="refresh period of the live view")
    parser.add_argument("--timeout-seconds", type=float, default=3.0, help="deadline of each call")
    for service in ("capacity", "scheduler", "planner", "batch"):
        parser.add_argument(
            f"--{service}-addr",
            default="",
            help=f"{service} gRPC address host:port (default: from --cluster, --state-dir or the one running "
            f"`bandmaster up`, else 127.0.0.1:{DEFAULT_PORTS[service]})"
            + ("; active/standby replicas: every address, comma-separated" if service == "scheduler" else ""),
        )
    parser.add_argument(
        "--scheduler-metrics-url",
        default="",
        help="the scheduler's /metrics URL, for the band edges in force (default: from --state-dir "
        "or the one running `bandmaster up`, else http://127.0.0.1:"
        f"{DEFAULT_PORTS['scheduler_metrics']}/metrics)",
    )
    endpoints.add_connection_arguments(parser)
    parser.set_defaults(run=run)


def _error(exc: grpc.RpcError, address: str, args: argparse.Namespace) -> str:
    return f"{address}: {endpoints.rpc_error(exc, address, args)}"


def read_bands(url: str, timeout_s: float) -> Bands:
    if not url:
        return Bands(source="reference defaults: the scheduler's /metrics port is not known")
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            text = response.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError):
        return Bands(source=f"reference defaults: {url} not readable")
    return parse_bands(text, "in force at the scheduler") or Bands(source="reference defaults: no band series")


def take_snapshot(
    args: argparse.Namespace, addresses: dict[str, str], metrics_url: str, absent: Mapping[str, str] = {}
) -> Snapshot:
    """One read of each service; a service in `absent` (the cluster does not run it) is not asked."""
    snapshot = Snapshot(taken_at=time.time())
    timeout = args.timeout_seconds
    channel, metadata = endpoints.channel(addresses["capacity"], args)
    with channel:
        try:
            snapshot.workers = capacity_pb2_grpc.CapacityStub(channel).ListWorkers(
                capacity_pb2.ListWorkersRequest(), timeout=timeout, metadata=metadata
            )
        except grpc.RpcError as exc:
            snapshot.workers_error = _error(exc, addresses["capacity"], args)
    snapshot.absent = {name: f"none in this cluster{why}" for name, why in absent.items()}
    scheduler = addresses["scheduler"]
    replicas = [a for a in scheduler.split(",") if a]
    if len(replicas) > 1:
        scheduler = _leading_scheduler(args, replicas, snapshot)
    if scheduler:
        _read_scheduler(args, scheduler, snapshot)
    if addresses["planner"]:
        _read_plan(args, addresses["planner"], snapshot)
    if addresses.get("batch"):
        snapshot.batch_health = batch_health(args, addresses["batch"])
    if snapshot.programs is not None:
        snapshot.bands = read_bands(metrics_url, timeout)
    return snapshot


def _read_scheduler(args: argparse.Namespace, scheduler: str, snapshot: Snapshot) -> None:
    timeout = args.timeout_seconds
    channel, metadata = endpoints.channel(scheduler, args)
    with channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        try:
            snapshot.programs = stub.ListPrograms(
                scheduler_pb2.ListProgramsRequest(), timeout=timeout, metadata=metadata
            )
            snapshot.stats = stub.GetStats(scheduler_pb2.GetStatsRequest(), timeout=timeout, metadata=metadata)
        except grpc.RpcError as exc:
            snapshot.programs = snapshot.stats = None
            snapshot.scheduler_error = _error(exc, scheduler, args)


def _read_plan(args: argparse.Namespace, planner: str, snapshot: Snapshot) -> None:
    channel, metadata = endpoints.channel(planner, args)
    with channel:
        try:
            snapshot.plan = planner_pb2_grpc.PlannerStub(channel).GetPlan(
                planner_pb2.GetPlanRequest(), timeout=args.timeout_seconds, metadata=metadata
            )
        except grpc.RpcError as exc:
            snapshot.planner_error = _error(exc, planner, args)


def batch_health(args: argparse.Namespace, address: str) -> str:
    """The batch service's health, one `grpc.health.v1` Check (its Batch API and dispatcher share its host)."""
    channel, metadata = endpoints.channel(address, args)
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=args.timeout_seconds, metadata=metadata
            )
        except grpc.RpcError as exc:
            return f"not answering at {_error(exc, address, args)}"
    return f"{health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)} at {address}"


def _leading_scheduler(args: argparse.Namespace, replicas: list[str], snapshot: Snapshot) -> str:
    """Ask each scheduler replica who leads (GetLeadership); note each one's role; return the leader's
    address (the first replica when none says it leads)."""
    leader = ""
    for address in replicas:
        channel, metadata = endpoints.channel(address, args)
        with channel:
            try:
                view = scheduler_pb2_grpc.SchedulerStub(channel).GetLeadership(
                    scheduler_pb2.GetLeadershipRequest(), timeout=args.timeout_seconds, metadata=metadata
                )
            except grpc.RpcError as exc:
                snapshot.schedulers.append((address, f"unreachable ({exc.code().name})"))
                continue
        role = view.role.upper() if view.role == "leader" else view.role
        snapshot.schedulers.append((address, f"{role} (epoch {view.epoch})"))
        if view.role in ("leader", "single"):
            leader = leader or address
        elif view.leader_address and not leader and view.leader_address in replicas:
            leader = view.leader_address
    return leader or replicas[0]


def _scheduler_addresses(args: argparse.Namespace) -> str:
    """The flag's address(es), else every scheduler replica of the found cluster ("" when it runs none),
    else the default."""
    if args.scheduler_addr:
        return args.scheduler_addr
    found: endpoints.Found | None = getattr(args, "found", None)
    if found is not None:
        return ",".join(found.schedulers())
    return endpoints.grpc_address(args, "", "scheduler")


_WHY_ABSENT = {"scheduler": " (started with --no-scheduler)", "planner": " (started with --no-planner)"}


def run(
    args: argparse.Namespace, *, out: Callable[[str], None] = print, sleep: Callable[[float], None] = time.sleep
) -> int:
    found = endpoints.discover(args, args.capacity_addr, args.scheduler_addr, args.planner_addr, args.batch_addr)
    endpoints.fill_security(args)
    addresses = {
        "capacity": endpoints.grpc_address(args, args.capacity_addr, "capacity"),
        "scheduler": _scheduler_addresses(args),
        "planner": endpoints.grpc_address(args, args.planner_addr, "planner", required=False),
        "batch": endpoints.grpc_address(args, args.batch_addr, "batch", required=False),
    }
    # A service the found cluster does not run is shown absent, never looked for on a default port.
    absent = {name: _WHY_ABSENT[name] for name in ("scheduler", "planner") if not addresses[name]}
    for name, address in addresses.items():
        for one in filter(None, address.split(",")):  # the scheduler: every replica's, comma-separated
            parse_host_port(one, f"{name}_addr")  # ConfigError -> exit 2 in services.cli.main
    metrics_url = args.scheduler_metrics_url
    if not metrics_url:
        port = endpoints.ready(args.state_dir, "scheduler").get("metrics_port")
        if not port and found is None:
            port = endpoints.default_address("scheduler_metrics").rpartition(":")[2]
        metrics_url = f"http://127.0.0.1:{port}/metrics" if port else ""
    given = (args.capacity_addr, args.scheduler_addr, args.planner_addr, args.batch_addr)
    where = f"scheduler {addresses['scheduler']}" if found is None and any(given) else endpoints.where(args)
    live = not args.once and sys.stdout.isatty()
    while True:
        snapshot = take_snapshot(args, addresses, metrics_url, absent)
        text = render(snapshot, where)
        if args.once:
            out(text)
            if not snapshot.reachable:
                print(
                    f"bandmaster status: no Bandmaster cluster answered at {where} (start one with `bandmaster "
                    "up`, or name it with --cluster, --state-dir or the --*-addr flags)",
                    file=sys.stderr,
                )
            return 0 if snapshot.reachable else 1
        out((_CLEAR if live else "") + text + f"\n\n(refreshing every {args.interval_seconds:g} s; Ctrl-C to stop)")
        sleep(args.interval_seconds)
