"""The metric names a PromQL expression reads, and the expressions of a Grafana dashboard and of a
Prometheus rule file.

Not a PromQL parser: it removes what cannot be a metric name (strings, label matchers, range and
subquery brackets, grouping clauses, Grafana variables, numbers and durations, functions,
keywords) and takes the identifiers that are left. That is enough for the expressions we write
and fails safe: an identifier it cannot explain is reported as a metric name, and a test then
names it.
"""

from __future__ import annotations

import re
from typing import Any, Iterator

# Series that Prometheus itself synthesizes for every target (not exported by a service).
PROMETHEUS_SYNTHETIC = frozenset(
    {
        "up",
        "scrape_duration_seconds",
        "scrape_samples_scraped",
        "scrape_samples_post_metric_relabeling",
        "scrape_series_added",
        "ALERTS",
        "ALERTS_FOR_STATE",
    }
)

_KEYWORDS = frozenset(
    {
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "offset",
        "and",
        "or",
        "unless",
        "atan2",
        "inf",
        "nan",
    }
)

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")
_FUNCTION = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\s*\(")
_IDENTIFIER = re.compile(r"(?<![\w:.])[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL_VALUES = re.compile(r"^\s*label_values\s*\((?P<selector>.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$", re.S)


def metric_names(expr: str) -> set[str]:
    """Every metric name `expr` selects (`{__name__=...}` selectors are not supported)."""
    if "__name__" in expr:
        raise ValueError(f"__name__ selectors are not checked: {expr!r}")
    text = _STRING.sub(" ", expr)
    text = _VARIABLE.sub(" ", text)
    text = _MATCHERS.sub(" ", text)
    text = _BRACKETS.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _FUNCTION.sub("(", text)
    return {name for name in _IDENTIFIER.findall(text) if name.lower() not in _KEYWORDS}


def template_metric_names(query: str) -> set[str]:
    """Metric names of a Grafana Prometheus variable query: `label_values(selector, label)`,
    `query_result(expr)` or a bare expression."""
    match = _LABEL_VALUES.match(query)
    if match:
        return metric_names(match.group("selector"))
    return metric_names(query)


def dashboard_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those nested in collapsed rows included (rows themselves are not yielded)."""
    for panel in dashboard.get("panels", ()):
        if panel.get("type") == "row":
            yield from panel.get("panels", ())
        else:
            yield panel


def dashboard_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, expr) for every panel target and every query variable of a Grafana dashboard."""
    out = []
    for panel in dashboard_panels(dashboard):
        for target in panel.get("targets", ()):
            out.append((f"panel {panel.get('title')!r} ref {target.get('refId')}", target.get("expr", "")))
    for variable in dashboard.get("templating", {}).get("list", ()):
        if variable.get("type") == "query":
            query = variable.get("query")
            if isinstance(query, dict):
                query = query.get("query", "")
            out.append((f"variable {variable.get('name')!r}", query or ""))
    return out


def dashboard_metric_names(dashboard: dict[str, Any]) -> dict[str, set[str]]:
    """Metric name -> where on the dashboard it is used."""
    out: dict[str, set[str]] = {}
    for where, expr in dashboard_queries(dashboard):
        names = template_metric_names(expr) if where.startswith("variable") else metric_names(expr)
        for name in names:
            out.setdefault(name, set()).add(where)
    return out


def rule_exprs(rule_file: dict[str, Any]) -> list[tuple[str, str]]:
    """(alert or record name, expr) for every rule of a Prometheus rule file."""
    return [
        (rule.get("alert") or rule.get("record") or "?", str(rule.get("expr", "")))
        for group in rule_file.get("groups", ())
        for rule in group.get("rules", ())
    ]
