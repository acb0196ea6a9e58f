"""The Prometheus metrics every service exports, read from the services' own registries.

    python scripts/metrics_table.py --write    # rewrite the table in docs/metrics.md
    python scripts/metrics_table.py --check    # exit 1 if docs/metrics.md is stale

Each service's metrics classes are instantiated on a fresh CollectorRegistry exactly as its
composition root does (the gRPC services' `ServiceHost` adds its own series to the same
registry), and the registry is collected. The scheduler's scrape-time collector reads a core
with one replica so that its per-replica families show their labels. Nothing is listed by hand:
a metric added to a service appears here, and the doc test fails until the page is regenerated.

`catalog()` and `exported_series()` are also what the dashboard and alert tests check PromQL
against.
"""

from __future__ import annotations

import asyncio
import pathlib
import sys
from dataclasses import dataclass
from typing import Iterable

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from prometheus_client import CollectorRegistry  # noqa: E402
from prometheus_client.registry import Collector  # noqa: E402

from scripts.doc_markers import run  # noqa: E402

DOC = ROOT / "docs" / "metrics.md"
SECTION = "metrics table (scripts/metrics_table.py)"
SERVICES = ("capacity", "scheduler", "router", "planner", "batch", "simworker")

# Labels whose values name a worker, replica or model of the deployment, or the process's build: the
# values the catalog sees for them come from its own fixtures (or this machine) and are not shown.
IDENTITY_LABELS = frozenset({"worker_id", "dp_rank", "model_name", "service", "version", "python_version"})

# Sample names prometheus_client writes for a family of each type (text format 0.0.4). No `_created`:
# every service turns it off (services/common/observe/process_metrics.py).
_SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
    "info": ("_info",),
    "stateset": ("",),
    "unknown": ("",),
}


@dataclass(frozen=True)
class MetricDoc:
    """One metric family as a service exports it."""

    services: tuple[str, ...]
    name: str
    """Family name (a counter's without `_total`)."""
    type: str
    labels: tuple[str, ...]
    label_values: tuple[tuple[str, tuple[str, ...]], ...]
    """Values a service creates up front for a label (enumerations), by label."""
    help: str

    @property
    def series(self) -> tuple[str, ...]:
        """Every sample name a scrape can show for this family."""
        return tuple(self.name + suffix for suffix in _SUFFIXES[self.type])

    @property
    def shown(self) -> tuple[str, ...]:
        """The names a query uses."""
        return self.series


# --- the registries, built like each service's composition root ------------------------------------


async def _host_registry(name: str, registry: CollectorRegistry) -> None:
    # ServiceHost needs a running loop for its grpc.aio server; it is never started.
    from services.common.serve.grpc_server import ServiceHost

    ServiceHost(name, registry=registry)


def _with_host(name: str, registry: CollectorRegistry) -> CollectorRegistry:
    asyncio.run(_host_registry(name, registry))
    return registry


def _capacity() -> CollectorRegistry:
    from services.capacity.metrics import CapacityMetrics

    registry = _with_host("capacity", CollectorRegistry())
    CapacityMetrics(registry)
    return registry


def _scheduler() -> CollectorRegistry:
    from services.scheduler.core import CapacitySnapshot, ControlParams, ReplicaCapacity, SchedulerCore
    from services.scheduler.metrics import SchedulerMetrics

    registry = _with_host("scheduler", CollectorRegistry())
    core = SchedulerCore(ControlParams())
    core.apply_capacity(0.0, CapacitySnapshot(1, (ReplicaCapacity("worker-0", 0, 1000, 0),)))
    SchedulerMetrics(registry).watch_core(core, now=lambda: 0.0, held=lambda: 0)
    return registry


def _router() -> CollectorRegistry:
    from services.router.observe.metrics import RouterMetrics

    return _with_host("router", RouterMetrics().registry)


def _planner() -> CollectorRegistry:
    from services.planner.metrics import PlannerMetrics

    registry = _with_host("planner", CollectorRegistry())
    PlannerMetrics(registry)
    return registry


def _batch() -> CollectorRegistry:
    from services.batch.metrics import BatchMetrics

    registry = _with_host("batch", CollectorRegistry())
    BatchMetrics(registry)
    return registry


def _simworker() -> CollectorRegistry:
    from services.simworker.core.api import EngineStats
    from services.simworker.metrics import SimWorkerMetrics

    return SimWorkerMetrics(EngineStats, "model").registry


_BUILDERS = {
    "capacity": _capacity,
    "scheduler": _scheduler,
    "router": _router,
    "planner": _planner,
    "batch": _batch,
    "simworker": _simworker,
}


def service_registries() -> dict[str, CollectorRegistry]:
    return {service: _BUILDERS[service]() for service in SERVICES}


# --- collection --------------------------------------------------------------------------------------


def _collectors(registry: CollectorRegistry) -> list[Collector]:
    # The registry keeps no public list of its collectors; one collect() per collector is what
    # ties a family to the label names its metric object declares (a labelled metric with no
    # child yet has no sample to read them from).
    with registry._lock:  # noqa: SLF001
        return list(registry._collector_to_names)  # noqa: SLF001


def _families(service: str, registry: CollectorRegistry) -> Iterable[MetricDoc]:
    for collector in _collectors(registry):
        declared = tuple(getattr(collector, "_labelnames", ()))
        for family in collector.collect():
            seen: dict[str, set[str]] = {}  # in order of first appearance: a collector's own label order
            for sample in family.samples:
                for label, value in sample.labels.items():
                    if label not in ("le", "quantile"):
                        seen.setdefault(label, set()).add(value)
            labels = declared + tuple(label for label in seen if label not in declared)
            values = tuple(
                (label, tuple(sorted(seen[label])))
                for label in labels
                if label in seen and label not in IDENTITY_LABELS
            )
            yield MetricDoc(
                (service,), family.name, family.type, labels, values, " ".join(family.documentation.split())
            )


def catalog(registries: dict[str, CollectorRegistry] | None = None) -> list[MetricDoc]:
    """Every family of every service, a family exported identically by several services once."""
    registries = registries if registries is not None else service_registries()
    merged: dict[tuple, MetricDoc] = {}
    for service, registry in registries.items():
        for doc in _families(service, registry):
            key = (doc.name, doc.type, doc.labels, doc.label_values, doc.help)
            if key in merged:
                merged[key] = MetricDoc((*merged[key].services, service), *key)
            else:
                merged[key] = doc
    order = {service: i for i, service in enumerate(SERVICES)}
    return sorted(merged.values(), key=lambda d: (len(d.services) > 1, order[d.services[0]], d.name))


def exported_series(docs: Iterable[MetricDoc] | None = None) -> dict[str, tuple[str, ...]]:
    """Sample name -> the services that export it (the set PromQL may name)."""
    out: dict[str, tuple[str, ...]] = {}
    for doc in docs if docs is not None else catalog():
        for name in doc.series:
            out[name] = tuple(sorted({*out.get(name, ()), *doc.services}, key=SERVICES.index))
    return out


# --- the table ---------------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _labels_cell(doc: MetricDoc) -> str:
    if not doc.labels and doc.type != "histogram":
        return ""
    values = dict(doc.label_values)
    parts = []
    for label in doc.labels:
        if label in values:
            parts.append(f"`{label}` ({', '.join(values[label])})")
        else:
            parts.append(f"`{label}`")
    if doc.type == "histogram":
        parts.append("`le` (`_bucket`)")
    return ", ".join(parts)


def _ports() -> list[tuple[str, str]]:
    """Where each service serves /metrics by default, from its settings."""
    from services.batch.config import SETTINGS as batch
    from services.capacity.config import SETTINGS as capacity
    from services.planner.config import SETTINGS as planner
    from services.router.config import SETTINGS as router
    from services.scheduler.config import SETTINGS as scheduler
    from services.simworker.config import SETTINGS as simworker

    def default(settings, name):
        return next(s for s in settings if s.name == name)

    rows = []
    for service, settings in (
        ("capacity", capacity),
        ("scheduler", scheduler),
        ("router", router),
        ("planner", planner),
        ("batch", batch),
    ):
        s = default(settings, "metrics_port")
        rows.append((service, f"`{s.flag_name}` (`{s.env}`), default {s.default}"))
    s = default(simworker, "port")
    rows.append(
        ("simworker", f"its HTTP API port `{s.flag_name}` (`{s.env}`), default {s.default}, like an SGLang server")
    )
    return rows


def render(docs: list[MetricDoc] | None = None) -> str:
    docs = docs if docs is not None else catalog()
    lines = ["| service | `/metrics` served on |", "|---|---|"]
    lines += [f"| {service} | {where} |" for service, where in _ports()]
    lines += ["", "| service | metric (as exported) | type | labels | meaning |", "|---|---|---|---|---|"]
    for doc in docs:
        names = "<br>".join(f"`{name}`" for name in doc.shown)
        lines.append(f"| {', '.join(doc.services)} | {names} | {doc.type} | {_labels_cell(doc)} | {_cell(doc.help)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return run(DOC, SECTION, render(), argv, "scripts/metrics_table.py")


if __name__ == "__main__":
    raise SystemExit(main())
