"""Metric names on both sides of a dashboard: those its PromQL uses, those a /metrics page exports.

A dashboard panel that names a metric nobody exports draws nothing and raises no error, so the
compose-equivalent run checks the names. PromQL is parsed roughly, on purpose: strings, label
matchers, range selectors, grouping clauses and Grafana variables are removed, and what is left that
looks like an identifier and is not a function call or a keyword is a metric name. That is enough for
dashboard queries and needs no PromQL parser.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable, Iterator

_KEYWORDS = frozenset({
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset",
    "inf", "nan", "start", "end", "atan2",
})
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"(?<![\w:.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])")


def promql_metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (functions, labels, keywords and variables excluded)."""
    text = _STRING.sub(" ", expr)
    text = re.sub(r"\$\{[^}]*\}|\$\w+|\[\[[^\]]*\]\]", " ", text)   # Grafana variables
    text = re.sub(r"\{[^}]*\}", " ", text)                           # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)                          # ranges, subqueries
    text = _GROUPING.sub(" ", text)
    names: set[str] = set()
    for match in _IDENTIFIER.finditer(text):
        name = match.group(1)
        following = text[match.end():].lstrip()
        if following.startswith("(") or name.lower() in _KEYWORDS:
            continue
        if re.fullmatch(r"\d+[smhdwy]?", name):  # a duration or number the class did not exclude
            continue
        names.add(name)
    return names


def dashboard_exprs(dashboard: Any) -> Iterator[str]:
    """Every `expr` string anywhere in a Grafana dashboard JSON (panels, rows, library panels)."""
    if isinstance(dashboard, dict):
        for key, value in dashboard.items():
            if key == "expr" and isinstance(value, str) and value.strip():
                yield value
            else:
                yield from dashboard_exprs(value)
    elif isinstance(dashboard, list):
        for item in dashboard:
            yield from dashboard_exprs(item)


def dashboard_metric_names(path: Path) -> dict[str, set[str]]:
    """{metric name: the expressions that use it} for one dashboard file."""
    used: dict[str, set[str]] = {}
    for expr in dashboard_exprs(json.loads(path.read_text())):
        for name in promql_metric_names(expr):
            used.setdefault(name, set()).add(expr)
    return used


_TYPE_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "info": ("_info",),
}


def exported_metric_names(exposition: str) -> set[str]:
    """Names a Prometheus text exposition makes queryable: every sample's name, and for each `# TYPE`
    the series its type produces (so a labelled metric with no child yet still counts)."""
    names: set[str] = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) >= 4:
                base, kind = parts[2], parts[3]
                names.add(base)
                names.update(base + suffix for suffix in _TYPE_SUFFIXES.get(kind, ()))
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return names


def missing_metrics(used: dict[str, set[str]], exported: Iterable[str]) -> dict[str, set[str]]:
    exported_set = set(exported)
    return {name: exprs for name, exprs in used.items() if name not in exported_set}
