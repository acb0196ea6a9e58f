"""Prometheus metrics of the scheduler, on the ServiceHost's per-instance registry.

Two kinds: instruments the shell updates as things happen (tick duration, hold time, tick
failures, capacity stream state, dropped watch events), and a collector that reads the core's
table and totals at scrape time, so the tick never pays for metrics it does not need and the
totals can never drift from the core's own counters.
"""

from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.scheduler.core import Band, Lifecycle, SchedulerCore, Status

_HOLD_BUCKETS_S = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 1800.0, 3600.0)
_TICK_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
PREFIX = "bandmaster_scheduler"


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._collector: _CoreCollector | None = None
        self.leader = Gauge(
            f"{PREFIX}_leader",
            "1 while this replica decides (the leader, or a single scheduler), 0 while it stands by",
            registry=registry,
        )
        self.leader_epoch = Gauge(
            f"{PREFIX}_leader_epoch",
            "The leadership epoch this replica holds or last saw (0 = none)",
            registry=registry,
        )
        self.leadership_changes = Counter(
            f"{PREFIX}_leadership_changes_total",
            "Leadership terms started (role=leader) and ended (role=standby, reason lost/expired/fenced/shutdown)",
            ["role", "reason"],
            registry=registry,
        )
        self.not_leader_refusals = Counter(
            f"{PREFIX}_not_leader_total",
            "RPCs a standby (or a deposed leader) refused with FAILED_PRECONDITION",
            registry=registry,
        )
        self.admit_mux_streams = Gauge(
            f"{PREFIX}_admit_mux_streams",
            "AdmitMux streams open (one per router process that admits on the multiplexed stream)",
            registry=registry,
        )
        self.tick_seconds = Histogram(
            f"{PREFIX}_tick_seconds",
            "Duration of one control tick (core + publishing)",
            buckets=_TICK_BUCKETS_S,
            registry=registry,
        )
        self.tick_failures = Counter(
            f"{PREFIX}_tick_failures_total", "Ticks that raised (retried next interval)", registry=registry
        )
        self.hold_seconds = Histogram(
            f"{PREFIX}_admission_hold_seconds",
            "How long held Admit calls waited, by how they ended",
            ["outcome"],
            buckets=_HOLD_BUCKETS_S,
            registry=registry,
        )
        self.core_compiled = Gauge(
            f"{PREFIX}_core_compiled",
            "1 when the scheduler core runs compiled (scripts/compile_core.py), 0 when it runs as pure Python",
            registry=registry,
        )
        self.capacity_connected = Gauge(
            f"{PREFIX}_capacity_stream_connected",
            "1 while the WatchWorkers stream to the capacity service is up",
            registry=registry,
        )
        self.capacity_reconnects = Counter(
            f"{PREFIX}_capacity_stream_failures_total",
            "WatchWorkers stream failures (each is followed by a reconnect)",
            registry=registry,
        )
        self.capacity_snapshots = Counter(
            f"{PREFIX}_capacity_snapshots_total", "Capacity snapshots applied", registry=registry
        )
        self.watch_dropped = Counter(
            f"{PREFIX}_watch_events_dropped_total",
            "WatchEvents events dropped because a watcher was too slow",
            registry=registry,
        )
        self.watchers = Gauge(f"{PREFIX}_watchers", "Open WatchEvents streams", registry=registry)
        for outcome in ("resumed", "forced", "released", "cancelled", "shutdown"):
            self.hold_seconds.labels(outcome)
        # Durable state (persist.py).
        self.state_recovery_seconds = Gauge(
            f"{PREFIX}_state_recovery_seconds", "Time to load and rebuild the program table at start", registry=registry
        )
        self.state_recovered_programs = Gauge(
            f"{PREFIX}_state_recovered_programs", "Programs recovered from the state store at start", registry=registry
        )
        self.state_tables_written_back = Counter(
            f"{PREFIX}_state_tables_written_back_total",
            "Terms that found the store without a table (it lost its data) and wrote this replica's own back",
            registry=registry,
        )
        self.state_write_seconds = Histogram(
            f"{PREFIX}_state_write_seconds",
            "Duration of one state batch write",
            buckets=_TICK_BUCKETS_S,
            registry=registry,
        )
        self.state_writes = Counter(
            f"{PREFIX}_state_writes_total", "State batches written, by kind (delta, full)", ["kind"], registry=registry
        )
        self.state_write_failures = Counter(
            f"{PREFIX}_state_write_failures_total",
            "State writes (or pings before a full rewrite) that failed or timed out",
            registry=registry,
        )
        self.state_store_up = Gauge(
            f"{PREFIX}_state_store_up", "1 while the state store takes writes (0 during an outage)", registry=registry
        )
        for kind in ("delta", "full"):
            self.state_writes.labels(kind)

    def watch_core(self, core: SchedulerCore | None, now: Callable[[], float], held: Callable[[], int]) -> None:
        """Register the scrape-time collector over `core` (one per registry); a later call points it at
        another core (a new leadership term's), None = no table (a standby)."""
        if self._collector is None:
            self._collector = _CoreCollector(core, now, held)
            self.registry.register(self._collector)
        else:
            self._collector.core, self._collector.now, self._collector.held = core, now, held


class _CoreCollector(Collector):
    def __init__(self, core: SchedulerCore | None, now: Callable[[], float], held: Callable[[], int]) -> None:
        self.core = core
        self.now = now
        self.held = held

    def describe(self) -> list[Metric]:
        return []  # unchecked collector: families depend on the table at scrape time

    def collect(self) -> Iterator[Metric]:
        core = self.core
        if core is None:
            return
        now = self.now()
        stats = core.stats(now)
        programs = GaugeMetricFamily(
            f"{PREFIX}_programs", "Programs in the table by lifecycle and status", labels=["lifecycle", "status"]
        )
        counts = {(lc, st): 0 for lc in Lifecycle for st in Status}
        for view in core.programs():
            counts[(view.lifecycle, view.status)] += 1
        for (lc, st), n in counts.items():
            programs.add_metric([lc.value, st.value], n)
        yield programs

        util = GaugeMetricFamily(
            f"{PREFIX}_replica_utilization",
            "Pause-side working set / retention budget per replica",
            labels=["worker_id", "dp_rank"],
        )
        used = GaugeMetricFamily(
            f"{PREFIX}_replica_used_tokens", "Pause-side working set per replica", labels=["worker_id", "dp_rank"]
        )
        retention = GaugeMetricFamily(
            f"{PREFIX}_replica_retention_tokens", "Retention budget per replica", labels=["worker_id", "dp_rank"]
        )
        band = GaugeMetricFamily(
            f"{PREFIX}_replica_band",
            "1 for the replica's current band, 0 for the others",
            labels=["worker_id", "dp_rank", "band"],
        )
        for r in stats.replicas:
            key = [r.replica.worker_id, str(r.replica.dp_rank)]
            util.add_metric(key, r.utilization)
            used.add_metric(key, r.used_tokens)
            retention.add_metric(key, r.retention_tokens)
            for b in Band:
                band.add_metric([*key, b.value], 1.0 if r.band is b else 0.0)
        yield from (util, used, retention, band)

        # The bands' edges as series, so a dashboard draws them next to the utilisation from the
        # flags in force rather than from numbers copied into it.
        params = core.params
        thresholds = GaugeMetricFamily(
            f"{PREFIX}_band_threshold_ratio",
            "Utilisation fraction at each band edge: pause (pause_threshold), soft_demote (soft_demote_threshold), "
            "resume (pause_threshold - resume_hysteresis: paused programs resume while the decayed working set "
            "is below it), target (where a pause cycle stops: pause_target, or with --pause-margin-quantile the pause "
            "threshold less the growth margin measured between ticks)",
            labels=["band"],
        )
        for name, value in (
            ("pause", params.pause_threshold),
            ("soft_demote", params.soft_demote_threshold),
            ("resume", params.resume_ceiling),
            ("target", core.control.pause_target_fraction()),
        ):
            thresholds.add_metric([name], value)
        yield thresholds

        for name, value, text in (
            ("pauses", stats.pauses_total, "Programs paused (pressure, marked, admission_full)"),
            ("resumes", stats.resumes_total, "Programs resumed, forced resumes included"),
            ("forced_resumes", stats.forced_resumes_total, "Forced resumes after resume_timeout_seconds"),
            ("marks", stats.marks_total, "Reasoning programs marked to pause at their next tool boundary"),
            ("expired", stats.expired_total, "Programs released after program_idle_ttl_seconds idle"),
            ("released", stats.released_total, "Programs released by their final request"),
            ("admissions", stats.admissions_total, "Admissions started"),
            ("admissions_cancelled", stats.admissions_cancelled_total, "Admissions rolled back"),
            (
                "completes_ignored",
                stats.completes_ignored_total,
                "Complete calls for a request id with no ticket (unknown, repeated, expired, held): ignored",
            ),
            (
                "tickets_expired",
                stats.tickets_expired_total,
                "Admitted turns ended because their router stopped renewing their lease",
            ),
            (
                "dispatched_while_paused",
                stats.dispatched_while_paused_total,
                "Turns a router started before their Admit (its fast path) whose program was paused meanwhile:"
                " admitted anyway, the program resumed where the turn runs",
            ),
        ):
            family = CounterMetricFamily(f"{PREFIX}_{name}", text)
            family.add_metric([], value)
            yield family
        tickets = GaugeMetricFamily(
            f"{PREFIX}_tickets_in_flight", "Admitted turns not yet completed (held ones included)"
        )
        tickets.add_metric([], stats.tickets_in_flight)
        yield tickets
        held = GaugeMetricFamily(f"{PREFIX}_held_admissions", "Admit calls currently held (program paused)")
        held.add_metric([], self.held())
        yield held
        ratio = GaugeMetricFamily(
            f"{PREFIX}_token_estimate_ratio",
            "Learnt ratio of the prompt tokens workers report to the routers' estimates (1 = exact estimates; "
            "applied to reasoning programs' charges when calibrate_token_estimates is on)",
        )
        ratio.add_metric([], core.calibration.ratio)
        yield ratio
        version = GaugeMetricFamily(f"{PREFIX}_capacity_version", "Version of the capacity snapshot in use")
        version.add_metric([], stats.capacity_version)
        yield version
