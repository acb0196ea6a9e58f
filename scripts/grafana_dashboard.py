"""The Grafana dashboard of a Bandmaster cluster, written as deploy/grafana/dashboards/bandmaster.json.

    python scripts/grafana_dashboard.py --write    # rewrite the JSON
    python scripts/grafana_dashboard.py --check    # exit 1 if the committed JSON differs

The panels are declared here in a few lines each. The script lays them out on Grafana's 24-column
grid, numbers them and fills in the boilerplate that Grafana expects, so that the committed JSON
stays consistent: one datasource reference everywhere, ids that are unique, no overlapping panels.
Every query names only series from docs/metrics.md (tests/unit/common/test_dashboard_alerts.py).

The datasource is the variable `DS_PROMETHEUS` (a Prometheus datasource picker, default uid
`prometheus`, the uid that deploy/compose provisions). An imported copy therefore works against
any Prometheus datasource.
"""

from __future__ import annotations

import json
import pathlib
import sys
from dataclasses import dataclass, field
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from scripts.doc_markers import generate  # noqa: E402

OUT = ROOT / "deploy" / "grafana" / "dashboards" / "bandmaster.json"

DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
UID = "bandmaster-overview"
RATE = "$__rate_interval"
WORKER = 'worker_id=~"$worker"'

# Band edge series drawn over the utilisation (legend name, band label, colour).
BAND_EDGES = (
    ("pause edge", "pause", "red"),
    ("soft-demote edge", "soft_demote", "orange"),
    ("resume edge", "resume", "green"),
    ("pause target", "target", "blue"),
)


@dataclass
class Query:
    expr: str
    legend: str = ""
    instant: bool = False


@dataclass
class Panel:
    title: str
    queries: list[Query]
    description: str
    kind: str = "timeseries"
    unit: str = "short"
    width: int = 8
    height: int = 8
    min: float | None = None
    max: float | None = None
    stack: bool = False
    decimals: int | None = None
    overrides: list[dict[str, Any]] = field(default_factory=list)
    mappings: list[dict[str, Any]] = field(default_factory=list)
    thresholds: list[tuple[float | None, str]] = field(default_factory=lambda: [(None, "green")])


@dataclass
class Row:
    title: str
    panels: list[Panel]


def _quantiles(metric: str, by: str, legend: str, selector: str = "") -> list[Query]:
    """p50/p95/p99 of a histogram, one series per value of `by` (sum over everything else)."""
    matchers = f"{{{selector}}}" if selector else ""
    inner = f"sum by (le{', ' + by if by else ''}) (rate({metric}_bucket{matchers}[{RATE}]))"
    return [
        Query(f"histogram_quantile({q}, {inner})", f"p{round(q * 100)} {legend}".strip()) for q in (0.5, 0.95, 0.99)
    ]


def _by_name(name: str, *properties: tuple[str, Any]) -> dict[str, Any]:
    return {
        "matcher": {"id": "byName", "options": name},
        "properties": [{"id": key, "value": value} for key, value in properties],
    }


def _edge_overrides() -> list[dict[str, Any]]:
    out = []
    for legend, band, colour in BAND_EDGES:
        props: list[tuple[str, Any]] = [
            ("color", {"mode": "fixed", "fixedColor": colour}),
            ("custom.lineStyle", {"fill": "dash", "dash": [10, 6]}),
            ("custom.lineWidth", 2),
            ("custom.fillOpacity", 0),
        ]
        if band == "pause":
            # Shade the soft-demote band: from the pause edge down to the soft-demote edge.
            props += [("custom.fillBelowTo", "soft-demote edge"), ("custom.fillOpacity", 12)]
        out.append(_by_name(legend, *props))
    return out


def _edges() -> list[Query]:
    return [
        Query(f'max(bandmaster_scheduler_band_threshold_ratio{{band="{band}"}})', legend)
        for legend, band, _ in BAND_EDGES
    ]


def _panels() -> list[Row]:
    return [
        Row(
            "Cluster",
            [
                Panel(
                    "Healthy workers",
                    [
                        Query('sum(bandmaster_capacity_workers{health="HEALTHY"})', "healthy"),
                        Query('sum(bandmaster_capacity_workers{health="UNHEALTHY"})', "unhealthy"),
                        Query('sum(bandmaster_capacity_workers{health="PENDING"})', "pending"),
                    ],
                    "Workers registered with the capacity service, by health (polled /health and /server_info).",
                    kind="stat",
                    width=6,
                    height=5,
                ),
                Panel(
                    "Programs",
                    [
                        Query('sum(bandmaster_scheduler_programs{lifecycle="active"})', "active"),
                        Query('sum(bandmaster_scheduler_programs{lifecycle="paused"})', "paused"),
                        Query("sum(bandmaster_scheduler_held_admissions)", "held turns"),
                    ],
                    "Programs in the scheduler's table, and turns held in Admit because their program is paused.",
                    kind="stat",
                    width=6,
                    height=5,
                ),
                Panel(
                    "Steps / min",
                    [
                        Query(
                            f'sum(rate(bandmaster_router_requests_total{{outcome="ok", traffic="online"}}'
                            f"[{RATE}])) * 60",
                            "online steps / min",
                        )
                    ],
                    "Agent steps (LLM turns) the routers completed per minute, online traffic only (batch requests "
                    "from the batch service's dispatcher are in 'Steps / min by traffic').",
                    kind="stat",
                    width=6,
                    height=5,
                    decimals=1,
                ),
                Panel(
                    "Scheduler reachable from routers",
                    [Query("min(bandmaster_router_scheduler_reachable)", "")],
                    "0 while any router fails open: turns are routed by KV cost alone, without admission, "
                    "pauses or pins (docs/operations.md).",
                    kind="stat",
                    width=6,
                    height=5,
                    mappings=[
                        {
                            "type": "value",
                            "options": {
                                "0": {"text": "FAIL-OPEN", "color": "red", "index": 0},
                                "1": {"text": "OK", "color": "green", "index": 1},
                            },
                        }
                    ],
                    thresholds=[(None, "red"), (1, "green")],
                ),
            ],
        ),
        Row(
            "Retention",
            [
                Panel(
                    "Retention utilisation per replica, with the bands",
                    [
                        Query(f"bandmaster_scheduler_replica_utilization{{{WORKER}}}", "{{worker_id}}/{{dp_rank}}"),
                        *_edges(),
                    ],
                    "Pause-side working set / retention budget (GPU KV + HiCache host tokens) per replica. Dashed: "
                    "the band edges in force (scheduler flags). At or above the pause edge the scheduler pauses "
                    "programs at tool boundaries down to the target; between the soft-demote and the pause edge "
                    "(shaded) new turns get a lower SGLang priority; paused programs resume while the decayed "
                    "working set is below the resume edge.",
                    unit="percentunit",
                    width=16,
                    height=10,
                    min=0,
                    overrides=_edge_overrides(),
                ),
                Panel(
                    "Band per replica",
                    [
                        Query(
                            f"max by (worker_id, dp_rank) "
                            f'(bandmaster_scheduler_replica_band{{{WORKER}, band="soft_demote"}})'
                            f" + 2 * max by (worker_id, dp_rank) "
                            f'(bandmaster_scheduler_replica_band{{{WORKER}, band="pause"}})',
                            "{{worker_id}}/{{dp_rank}}",
                        )
                    ],
                    "The band the scheduler computed for each replica (counting max_programs too, when a worker "
                    "reports one).",
                    kind="state-timeline",
                    width=8,
                    height=10,
                    mappings=[
                        {
                            "type": "value",
                            "options": {
                                "0": {"text": "normal", "color": "green", "index": 0},
                                "1": {"text": "soft demote", "color": "orange", "index": 1},
                                "2": {"text": "pause", "color": "red", "index": 2},
                            },
                        }
                    ],
                    thresholds=[(None, "green"), (1, "orange"), (2, "red")],
                ),
                Panel(
                    "Working set and budget per replica",
                    [
                        Query(
                            f"bandmaster_scheduler_replica_used_tokens{{{WORKER}}}", "used {{worker_id}}/{{dp_rank}}"
                        ),
                        Query(
                            f"bandmaster_scheduler_replica_retention_tokens{{{WORKER}}}",
                            "budget {{worker_id}}/{{dp_rank}}",
                        ),
                    ],
                    "Tokens charged to each replica by the scheduler and the replica's retention budget.",
                    width=12,
                ),
                Panel(
                    "Retention budget by source",
                    [
                        Query(
                            f"sum by (worker_id, source) (bandmaster_capacity_replica_retention_tokens{{{WORKER}}})",
                            "{{worker_id}} {{source}}",
                        )
                    ],
                    "Per worker, as the capacity service computes it from /server_info: GPU_ONLY or GPU_PLUS_HOST "
                    "(native HiCache host tier counted; storage backends never are).",
                    width=12,
                ),
                Panel(
                    "Token estimate ratio",
                    [Query("max(bandmaster_scheduler_token_estimate_ratio)", "reported / estimated")],
                    "Prompt tokens the workers report per token the routers estimate, as the scheduler learns it. "
                    "1 with a router tokenizer (--tokenizer); far from 1 means the text estimate is off for this "
                    "model and the scheduler is correcting it (calibrate_token_estimates).",
                    width=12,
                ),
            ],
        ),
        Row(
            "Programs",
            [
                Panel(
                    "Programs by state",
                    [Query("sum by (lifecycle, status) (bandmaster_scheduler_programs)", "{{lifecycle}} {{status}}")],
                    "reasoning = a turn at the engine; acting = at a tool boundary; paused = held out of the "
                    "working set until room returns.",
                    width=8,
                    stack=True,
                ),
                Panel(
                    "Pauses and resumes / min",
                    [
                        Query(f"rate(bandmaster_scheduler_pauses_total[{RATE}]) * 60", "pauses"),
                        Query(f"rate(bandmaster_scheduler_resumes_total[{RATE}]) * 60", "resumes"),
                        Query(f"rate(bandmaster_scheduler_forced_resumes_total[{RATE}]) * 60", "forced resumes"),
                        Query(f"rate(bandmaster_scheduler_marks_total[{RATE}]) * 60", "marks"),
                        Query(f"rate(bandmaster_scheduler_expired_total[{RATE}]) * 60", "expired"),
                    ],
                    "Forced resumes are programs that hit resume_timeout_seconds while paused: the cluster had no "
                    "room for them for that long.",
                    width=8,
                    overrides=[_by_name("forced resumes", ("color", {"mode": "fixed", "fixedColor": "red"}))],
                ),
                Panel(
                    "Admission hold time",
                    _quantiles("bandmaster_scheduler_admission_hold_seconds", "", "held"),
                    "How long held Admit calls waited before they ended (resumed, forced, released, cancelled).",
                    unit="s",
                    width=8,
                ),
            ],
        ),
        Row(
            "Latency and throughput",
            [
                Panel(
                    "TTFT at the router",
                    _quantiles("bandmaster_router_ttft_seconds", "traffic", "{{traffic}}"),
                    "Dispatch to the worker's first chunk of streamed turns, by traffic (online agents, batch).",
                    unit="s",
                    width=8,
                ),
                Panel(
                    "ITL at the workers",
                    _quantiles("sglang:inter_token_latency_seconds", "", ""),
                    "Inter-token latency reported by the workers (SGLang's histogram; a simworker reports its "
                    "virtual time).",
                    unit="s",
                    width=8,
                ),
                Panel(
                    "Admit wait at the router",
                    _quantiles("bandmaster_router_admit_wait_seconds", "", ""),
                    "Time turns spent in the scheduler's Admit: near zero unless programs are paused.",
                    unit="s",
                    width=8,
                ),
                Panel(
                    "Steps / min by traffic",
                    [
                        Query(
                            f"sum by (traffic, path) "
                            f'(rate(bandmaster_router_requests_total{{outcome="ok"}}[{RATE}])) * 60',
                            "{{traffic}} {{path}}",
                        ),
                        Query(f"rate(bandmaster_scheduler_admissions_total[{RATE}]) * 60", "admissions"),
                    ],
                    "Completed turns per minute at the routers by traffic and path (program: with a session header; "
                    "passthrough: without one; final: a program's last request), and admissions at the scheduler.",
                    width=8,
                ),
                Panel(
                    "TTFT at the workers",
                    _quantiles("sglang:time_to_first_token_seconds", "", ""),
                    "Time to first token as the workers measure it (queueing and prefill at the engine).",
                    unit="s",
                    width=8,
                ),
                Panel(
                    "Turns in flight",
                    [
                        Query("sum by (traffic) (bandmaster_router_requests_in_flight)", "{{traffic}}"),
                        Query("sum(bandmaster_scheduler_tickets_in_flight)", "scheduler tickets"),
                    ],
                    "Turns being served by the routers, and admitted turns the scheduler has not seen complete.",
                    width=8,
                ),
            ],
        ),
        Row(
            "KV cache",
            [
                Panel(
                    "KV hit rate",
                    [
                        Query(
                            f"sum(rate(sglang:cached_tokens_total[{RATE}])) "
                            f"/ sum(rate(sglang:prompt_tokens_total[{RATE}]))",
                            "cluster",
                        ),
                        Query(
                            f"sum by (instance) (rate(sglang:cached_tokens_total[{RATE}])) / "
                            f"sum by (instance) (rate(sglang:prompt_tokens_total[{RATE}]))",
                            "{{instance}}",
                        ),
                    ],
                    "Prompt tokens served from the workers' prefix cache (GPU or host tier) / prompt tokens.",
                    unit="percentunit",
                    width=8,
                    min=0,
                    max=1,
                ),
                Panel(
                    "Router prefix prediction vs workers",
                    [
                        Query(
                            f"sum(rate(bandmaster_router_predicted_cached_tokens_total[{RATE}]))", "predicted by router"
                        ),
                        Query(f"sum(rate(sglang:cached_tokens_total[{RATE}]))", "cached at workers"),
                    ],
                    "Cached prompt tokens per second: what the router's prefix index expected at the worker it "
                    "picked, and what the workers reported.",
                    width=8,
                ),
                Panel(
                    "KV token usage per worker",
                    [Query("sglang:token_usage", "{{instance}}")],
                    "Fraction of each worker's GPU KV pool in use.",
                    unit="percentunit",
                    width=8,
                    min=0,
                    max=1,
                ),
            ],
        ),
        Row(
            "Router",
            [
                Panel(
                    "Requests by outcome",
                    [Query(f"sum by (outcome) (rate(bandmaster_router_requests_total[{RATE}]))", "{{outcome}}")],
                    "Requests per second at the routers by outcome.",
                    unit="reqps",
                    width=8,
                ),
                Panel(
                    "Upstream errors and fail-open",
                    [
                        Query(
                            f"sum by (kind, phase) (rate(bandmaster_router_upstream_errors_total[{RATE}]))",
                            "upstream {{kind}} {{phase}}",
                        ),
                        Query(
                            f"sum by (reason) (rate(bandmaster_router_scheduler_fail_open_total[{RATE}]))",
                            "fail-open {{reason}}",
                        ),
                        Query(f"sum(rate(bandmaster_router_retries_total[{RATE}]))", "retries"),
                    ],
                    "Worker failures by kind and phase, turns routed without admission by reason, and retries on "
                    "another worker.",
                    unit="reqps",
                    width=8,
                ),
                Panel(
                    "Workers in rotation",
                    [
                        Query("min(bandmaster_router_workers)", "healthy (router view)"),
                        Query("max(bandmaster_router_workers_out_of_rotation)", "circuit open"),
                        Query(
                            f"sum by (state) (increase(bandmaster_router_worker_circuit_transitions_total[{RATE}]))",
                            "to {{state}}",
                        ),
                    ],
                    "Healthy workers each router knows from capacity, and those its circuit breaker took out of "
                    "rotation.",
                    width=8,
                ),
            ],
        ),
        Row(
            "Planner",
            [
                Panel(
                    "Lease rate",
                    [
                        Query("bandmaster_planner_lease_max_admission_rps", "lease max admission rps"),
                        Query("bandmaster_batch_dispatch_rate_cap_rps", "batch service rate cap"),
                    ],
                    "Batch admission rate granted by the last published drain lease, and the rate the dispatcher "
                    "(the batch service) applies now (0 = lease missing, expired or paused).",
                    unit="reqps",
                    width=8,
                ),
                Panel(
                    "Replica targets",
                    [
                        Query("bandmaster_planner_target_replicas", "target"),
                        Query("bandmaster_planner_ready_replicas", "ready"),
                        Query("bandmaster_planner_batch_replica_floor", "batch floor"),
                    ],
                    "The planner's merged replica target, the ready replicas it sees and the batch floor "
                    "(-1 = no opinion / unknown / none).",
                    width=8,
                ),
                Panel(
                    "Planner ticks and fail-closed",
                    [
                        Query(f"sum by (action) (rate(bandmaster_planner_ticks_total[{RATE}])) * 60", "{{action}}"),
                        Query(
                            f"sum by (reason) (rate(bandmaster_planner_fail_closed_total[{RATE}])) * 60",
                            "fail-closed {{reason}}",
                        ),
                    ],
                    "Ticks per minute by action; a fail-closed tick publishes no rate for batch work.",
                    width=8,
                ),
            ],
        ),
        Row(
            "Control plane",
            [
                Panel(
                    "Capacity polls",
                    [
                        Query(
                            f"sum by (reason) (rate(bandmaster_capacity_poll_failures_total[{RATE}]))",
                            "poll failure {{reason}}",
                        ),
                        Query(
                            f"sum by (reason) (rate(bandmaster_capacity_card_rejections_total[{RATE}]))",
                            "card rejected {{reason}}",
                        ),
                    ],
                    "Failed polls of the workers' /health and /server_info, and cards refused.",
                    width=8,
                ),
                Panel(
                    "Watch streams",
                    [
                        Query("min(bandmaster_scheduler_capacity_stream_connected)", "scheduler <- capacity"),
                        Query("min(bandmaster_router_capacity_connected)", "routers <- capacity"),
                        Query("min(bandmaster_scheduler_state_store_up)", "scheduler state store"),
                    ],
                    "1 while each stream (or the scheduler's state store) is up.",
                    width=8,
                    min=0,
                    max=1,
                ),
                Panel(
                    "Scheduler tick and event loops",
                    [
                        *_quantiles("bandmaster_scheduler_tick_seconds", "", "tick")[1:2],
                        Query(
                            f"histogram_quantile(0.99, sum by (le, job) "
                            f"(rate(bandmaster_event_loop_lag_seconds_bucket[{RATE}])))",
                            "p99 loop lag {{job}}",
                        ),
                    ],
                    "Control tick duration, and how late each service's event loop runs its timers.",
                    unit="s",
                    width=8,
                ),
            ],
        ),
    ]


# --- layout and boilerplate ---------------------------------------------------------------------------


def _thresholds(steps: list[tuple[float | None, str]]) -> dict[str, Any]:
    return {"mode": "absolute", "steps": [{"color": colour, "value": value} for value, colour in steps]}


def _panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    refs = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    targets = [
        {
            "datasource": DATASOURCE,
            "editorMode": "code",
            "expr": q.expr,
            "legendFormat": q.legend or "__auto",
            "range": not q.instant,
            "instant": q.instant,
            "refId": refs[i],
        }
        for i, q in enumerate(panel.queries)
    ]
    defaults: dict[str, Any] = {
        "unit": panel.unit,
        "mappings": panel.mappings,
        "thresholds": _thresholds(panel.thresholds),
        "color": {"mode": "palette-classic"},
    }
    if panel.min is not None:
        defaults["min"] = panel.min
    if panel.max is not None:
        defaults["max"] = panel.max
    if panel.decimals is not None:
        defaults["decimals"] = panel.decimals
    options: dict[str, Any]
    if panel.kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10 if panel.stack else 0,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"mode": "normal" if panel.stack else "none", "group": "A"},
        }
        options = {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    elif panel.kind == "stat":
        defaults["color"] = {"mode": "thresholds"}
        options = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "justifyMode": "auto",
            "orientation": "auto",
            "textMode": "value_and_name",
        }
    elif panel.kind == "state-timeline":
        defaults["color"] = {"mode": "thresholds"}
        defaults["custom"] = {"fillOpacity": 80, "lineWidth": 0}
        options = {
            "showValue": "never",
            "mergeValues": True,
            "rowHeight": 0.9,
            "alignValue": "left",
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "single", "sort": "none"},
        }
    else:
        raise ValueError(f"unknown panel kind {panel.kind}")
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": panel.overrides},
        "options": options,
        "targets": targets,
    }


def _layout(rows: list[Row]) -> list[dict[str, Any]]:
    """Rows stacked top to bottom; a row's panels fill 24 columns left to right, then wrap."""
    out: list[dict[str, Any]] = []
    y = 0
    panel_id = 1
    for row in rows:
        out.append(
            {
                "id": panel_id,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "panels": [],
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
            }
        )
        panel_id += 1
        y += 1
        x, line_height = 0, 0
        for panel in row.panels:
            if x + panel.width > 24:
                x, y, line_height = 0, y + line_height, 0
            out.append(_panel_json(panel, panel_id, x, y))
            panel_id += 1
            x += panel.width
            line_height = max(line_height, panel.height)
        y += line_height
    return out


def dashboard() -> dict[str, Any]:
    return {
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "description": "Bandmaster: program-aware scheduling of agentic LLM inference (docs/operations.md)",
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [],
        "panels": _layout(_panels()),
        "refresh": "10s",
        "schemaVersion": 39,
        "tags": ["bandmaster", "llm-inference"],
        "templating": {
            "list": [
                {
                    "name": "DS_PROMETHEUS",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {"selected": False, "text": "Prometheus", "value": "prometheus"},
                    "hide": 0,
                    "includeAll": False,
                    "multi": False,
                    "options": [],
                    "refresh": 1,
                    "regex": "",
                },
                {
                    "name": "worker",
                    "label": "worker",
                    "type": "query",
                    "datasource": DATASOURCE,
                    "definition": "label_values(bandmaster_scheduler_replica_utilization, worker_id)",
                    "query": {
                        "qryType": 1,
                        "query": "label_values(bandmaster_scheduler_replica_utilization, worker_id)",
                        "refId": "PrometheusVariableQueryEditor-VariableQuery",
                    },
                    "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
                    "hide": 0,
                    "includeAll": True,
                    "allValue": ".*",
                    "multi": True,
                    "options": [],
                    "refresh": 2,
                    "regex": "",
                    "sort": 1,
                },
            ]
        },
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "title": "Bandmaster",
        "uid": UID,
        "version": 1,
        "weekStart": "",
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    return generate(OUT, render(), argv, "scripts/grafana_dashboard.py", "the Grafana dashboard")


if __name__ == "__main__":
    raise SystemExit(main())
