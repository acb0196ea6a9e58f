"""The Grafana dashboard (deploy/grafana/dashboards/bandmaster.json) and the alerting rules
(deploy/prometheus/alerts.yml): structure, datasource references, and that every query names a
series some service exports (the registries behind docs/metrics.md).

With promtool on the PATH or in the venv (`make test` unpacks it from Debian's prometheus
package), the rules are also checked and unit-tested by Prometheus's own evaluator, and the
dashboard's queries are parsed by it.
"""

from __future__ import annotations

import copy
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from scripts import grafana_dashboard, metrics_table
from tests.support.promql import (
    PROMETHEUS_SYNTHETIC,
    dashboard_metric_names,
    dashboard_panels,
    dashboard_queries,
    metric_names,
    rule_exprs,
)

ROOT = pathlib.Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "bandmaster.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
OPERATIONS = ROOT / "docs" / "operations.md"
DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def exported() -> dict[str, tuple[str, ...]]:
    return metrics_table.exported_series()


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


@pytest.fixture(scope="module")
def rules() -> dict:
    return yaml.safe_load(ALERTS.read_text())


def _promtool() -> str | None:
    venv_bin = str(pathlib.Path(sys.executable).parent)
    return shutil.which("promtool", path=os.pathsep.join([venv_bin, os.environ.get("PATH", "")]))


needs_promtool = pytest.mark.skipif(
    _promtool() is None, reason="promtool not installed (`make test` unpacks it into the venv)"
)


# --- the dashboard -------------------------------------------------------------------------------------


def test_dashboard_json_is_what_the_generator_writes():
    assert DASHBOARD.read_text() == grafana_dashboard.render(), "run `python scripts/grafana_dashboard.py --write`"


def test_dashboard_top_level(dashboard):
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert dashboard["uid"] and dashboard["title"] == "Bandmaster"
    assert dashboard["id"] is None  # provisioned and imported dashboards get their id from Grafana
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    ds = variables["DS_PROMETHEUS"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    assert ds["current"]["value"] == "prometheus"  # the uid deploy/compose provisions


def test_every_panel_has_a_query_and_the_one_datasource(dashboard):
    panels = list(dashboard_panels(dashboard))
    assert len(panels) >= 20
    for panel in panels:
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(set(ref_ids)) == len(ref_ids), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
            assert target["expr"].strip(), f"panel {panel['title']!r} has an empty query"
        assert panel.get("description"), f"panel {panel['title']!r} says nothing about what it shows"
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            assert variable["datasource"] == DATASOURCE, variable["name"]


def test_panels_are_laid_out_without_overlap(dashboard):
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(set(ids)) == len(ids)
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, panel["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]


def test_every_dashboard_query_names_an_exported_series(dashboard, exported):
    unknown = {name: sorted(where) for name, where in dashboard_metric_names(dashboard).items() if name not in exported}
    assert not unknown, f"series no service exports (docs/metrics.md): {unknown}"


def _queries_of(dashboard: dict, title_part: str) -> str:
    return "\n".join(
        t["expr"] for p in dashboard_panels(dashboard) if title_part.lower() in p["title"].lower() for t in p["targets"]
    )


def test_dashboard_shows_what_operators_need(dashboard):
    util = _queries_of(dashboard, "Retention utilisation per replica")
    assert "bandmaster_scheduler_replica_utilization" in util
    for band in ("pause", "soft_demote", "resume"):
        assert f'bandmaster_scheduler_band_threshold_ratio{{band="{band}"}}' in util, band
    assert "bandmaster_scheduler_programs" in _queries_of(dashboard, "Programs by state")
    pauses = _queries_of(dashboard, "Pauses and resumes")
    assert "bandmaster_scheduler_pauses_total" in pauses and "bandmaster_scheduler_resumes_total" in pauses
    assert "histogram_quantile" in _queries_of(dashboard, "TTFT at the router")
    assert "bandmaster_router_ttft_seconds_bucket" in _queries_of(dashboard, "TTFT at the router")
    assert "sglang:inter_token_latency_seconds_bucket" in _queries_of(dashboard, "ITL")
    assert "* 60" in _queries_of(dashboard, "Steps / min")
    hit = _queries_of(dashboard, "KV hit rate")
    assert "sglang:cached_tokens_total" in hit and "sglang:prompt_tokens_total" in hit
    assert "bandmaster_planner_lease_max_admission_rps" in _queries_of(dashboard, "Lease rate")
    assert "bandmaster_planner_target_replicas" in _queries_of(dashboard, "Replica targets")


def test_band_edges_are_drawn_as_dashed_lines(dashboard):
    panel = next(p for p in dashboard_panels(dashboard) if p["title"].startswith("Retention utilisation"))
    legends = {t["legendFormat"] for t in panel["targets"]}
    styled = {
        o["matcher"]["options"]: {p["id"]: p["value"] for p in o["properties"]}
        for o in panel["fieldConfig"]["overrides"]
    }
    for legend, _, _ in grafana_dashboard.BAND_EDGES:
        assert legend in legends
        assert styled[legend]["custom.lineStyle"]["fill"] == "dash"
    assert styled["pause edge"]["custom.fillBelowTo"] in legends


# --- the alerting rules ---------------------------------------------------------------------------------

_DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")


def test_rule_file_structure(rules):
    assert set(rules) == {"groups"}
    group_names = [g["name"] for g in rules["groups"]]
    assert len(set(group_names)) == len(group_names)
    alerts = []
    for group in rules["groups"]:
        assert set(group) <= {"name", "interval", "rules", "limit"}, group["name"]
        assert group["rules"], group["name"]
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}, rule
            assert re.fullmatch(r"Bandmaster[A-Z][A-Za-z]+", rule["alert"]), rule["alert"]
            assert isinstance(rule["expr"], str) and rule["expr"].strip(), rule["alert"]
            if "for" in rule:
                assert _DURATION.match(rule["for"]), rule["alert"]
            assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
            assert {"summary", "description", "runbook"} <= set(rule["annotations"]), rule["alert"]
            alerts.append(rule["alert"])
    assert len(set(alerts)) == len(alerts)


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    out = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            text = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return out


def test_every_alert_has_a_runbook_section(rules):
    anchors = _anchors(OPERATIONS.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            page, _, anchor = rule["annotations"]["runbook"].partition("#")
            assert page == "docs/operations.md", rule["alert"]
            assert anchor == rule["alert"].lower() and anchor in anchors, rule["alert"]


def test_operations_page_anchors_resolve():
    """Every `#anchor` link on the page and into a sibling doc names a heading there."""
    page = OPERATIONS.read_text()
    for target, anchor in re.findall(r"\]\(([\w./-]*)#([\w-]+)\)", page):
        doc = OPERATIONS if not target else OPERATIONS.parent / target
        if doc.exists():  # a page another change adds later is not checked here
            assert anchor in _anchors(doc.read_text()), f"{target or 'operations.md'}#{anchor}"


def test_every_alert_names_an_exported_series(rules, exported):
    for alert, expr in rule_exprs(rules):
        unknown = metric_names(expr) - set(exported) - PROMETHEUS_SYNTHETIC
        assert not unknown, f"{alert}: series no service exports (docs/metrics.md): {sorted(unknown)}"


def test_failure_modes_are_covered(rules):
    exprs = "\n".join(expr for _, expr in rule_exprs(rules))
    for series in (
        "bandmaster_router_scheduler_reachable",
        "bandmaster_router_workers_out_of_rotation",
        "bandmaster_capacity_workers",
        "bandmaster_scheduler_replica_band",
        "bandmaster_scheduler_forced_resumes_total",
        "bandmaster_router_upstream_errors_total",
        "bandmaster_planner_fail_closed_total",
        "bandmaster_planner_lease_valid_until_seconds",
        "bandmaster_capacity_poll_failures_total",
    ):
        assert series in exprs, series


# --- promtool -------------------------------------------------------------------------------------------


def _run(args: list[str], cwd: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run([_promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=60)


@needs_promtool
def test_promtool_checks_the_rule_file(tmp_path):
    result = _run(["check", "rules", str(ALERTS)], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_parses_every_dashboard_query(dashboard, tmp_path):
    """Each query as a recording rule, Grafana's variables replaced by values Prometheus accepts."""

    def concrete(expr: str) -> str:
        return expr.replace("$__rate_interval", "5m").replace("$__interval", "1m").replace('"$worker"', '".*"')

    records = [
        {"record": f"dashboard:query_{i}", "expr": concrete(expr)}
        for i, (_, expr) in enumerate(dashboard_queries(dashboard))
        if not expr.startswith("label_values(")
    ]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
    result = _run(["check", "rules", str(path)], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def _alert_cases() -> list[dict]:
    """promtool rule unit tests: (input series, when, which alert, the labels it fires with)."""

    def fires(alert: str, at: str, **labels: str) -> dict:
        return {"eval_time": at, "alertname": alert, "exp_alerts": [{"exp_labels": labels}]}

    def quiet(alert: str, at: str) -> dict:
        return {"eval_time": at, "alertname": alert, "exp_alerts": []}

    router = {"instance": "router-1:9103", "job": "router"}
    planner = {"instance": "planner:9105", "job": "planner"}

    def series(name: str, values: str, **labels: str) -> dict:
        body = ", ".join(f'{k}="{v}"' for k, v in labels.items())
        return {"series": f"{name}{{{body}}}", "values": values}

    return [
        {
            "input_series": [
                series("bandmaster_router_scheduler_reachable", "1 1 0x10", **router),
                series("bandmaster_scheduler_tick_seconds_count", "0+1x12", instance="s", job="scheduler"),
            ],
            "alert_rule_test": [
                quiet("BandmasterRouterFailingOpen", "2m"),
                fires("BandmasterRouterFailingOpen", "4m", severity="critical", **router),
                quiet("BandmasterSchedulerAbsent", "10m"),
            ],
        },
        {"input_series": [], "alert_rule_test": [fires("BandmasterSchedulerAbsent", "3m", severity="critical")]},
        {
            "input_series": [
                series("bandmaster_scheduler_replica_band", "1x20", worker_id="w0", dp_rank="0", band="pause"),
                series("bandmaster_scheduler_replica_band", "0x20", worker_id="w1", dp_rank="0", band="pause"),
            ],
            "alert_rule_test": [
                quiet("BandmasterRetentionAbovePauseBand", "5m"),
                fires("BandmasterRetentionAbovePauseBand", "12m", severity="warning", worker_id="w0", dp_rank="0"),
            ],
        },
        {
            "input_series": [
                series("bandmaster_router_requests_total", "0+100x20", outcome="ok", **router),
                series(
                    "bandmaster_router_upstream_errors_total", "0+10x20", kind="ReadError", phase="stream", **router
                ),
            ],
            "alert_rule_test": [
                fires("BandmasterUpstreamErrorRate", "15m", severity="warning", instance=router["instance"])
            ],
        },
        {
            "input_series": [
                series("bandmaster_router_requests_total", "0+100x20", outcome="ok", **router),
                series("bandmaster_router_upstream_errors_total", "0+1x20", kind="ReadError", phase="stream", **router),
            ],
            "alert_rule_test": [quiet("BandmasterUpstreamErrorRate", "15m")],
        },
        {
            "input_series": [
                series("bandmaster_scheduler_programs", "3x40", lifecycle="paused", status="acting"),
                series("bandmaster_scheduler_resumes_total", "7x40"),
            ],
            "alert_rule_test": [
                quiet("BandmasterResumesStalled", "10m"),
                fires("BandmasterResumesStalled", "20m", severity="warning"),
            ],
        },
        {
            "input_series": [
                series("bandmaster_scheduler_programs", "3x40", lifecycle="paused", status="acting"),
                series("bandmaster_scheduler_resumes_total", "0+1x40"),
            ],
            "alert_rule_test": [quiet("BandmasterResumesStalled", "35m")],
        },
        # Leases: one published at t=0 valid for 60 s and never again, against one renewed every minute.
        {
            "input_series": [series("bandmaster_planner_lease_valid_until_seconds", "60x10", **planner)],
            "alert_rule_test": [
                quiet("BandmasterPlannerLeaseExpired", "1m"),
                fires("BandmasterPlannerLeaseExpired", "3m", severity="warning", **planner),
            ],
        },
        {
            "input_series": [series("bandmaster_planner_lease_valid_until_seconds", "60+60x10", **planner)],
            "alert_rule_test": [quiet("BandmasterPlannerLeaseExpired", "8m")],
        },
        {
            "input_series": [
                series("bandmaster_planner_ready_replicas", "1x30", **planner),
                series("bandmaster_planner_target_replicas", "3x30", **planner),
            ],
            "alert_rule_test": [fires("BandmasterPlannerReplicasBelowTarget", "20m", severity="warning", **planner)],
        },
        {
            "input_series": [
                series("bandmaster_planner_ready_replicas", "-1x30", **planner),
                series("bandmaster_planner_target_replicas", "3x30", **planner),
            ],
            "alert_rule_test": [quiet("BandmasterPlannerReplicasBelowTarget", "20m")],
        },
        {
            "input_series": [
                series("bandmaster_planner_fail_closed_total", "0+1x10", reason="lease_unknown", **planner)
            ],
            "alert_rule_test": [
                fires("BandmasterPlannerLeaseWriteFailing", "8m", severity="critical", instance=planner["instance"])
            ],
        },
        {
            "input_series": [
                series("bandmaster_capacity_workers", "0x5", health="HEALTHY"),
                series("bandmaster_capacity_workers", "2x5", health="UNHEALTHY"),
            ],
            "alert_rule_test": [
                fires("BandmasterNoHealthyWorker", "3m", severity="critical"),
                fires("BandmasterWorkerUnhealthy", "3m", severity="warning"),
            ],
        },
    ]


@needs_promtool
def test_promtool_unit_tests_of_the_alerts(rules, tmp_path):
    """The rules evaluated by Prometheus's own engine on made-up series. Annotations are left out of
    the copy under test (promtool compares them verbatim; their text is for people)."""
    bare = copy.deepcopy(rules)
    for group in bare["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(bare))
    tests = {
        "rule_files": ["alerts.yml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", **case} for case in _alert_cases()],
    }
    (tmp_path / "alerts_test.yml").write_text(yaml.safe_dump(tests))
    result = _run(["test", "rules", "alerts_test.yml"], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
