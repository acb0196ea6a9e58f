"""Metric names on both sides of a dashboard: those its PromQL uses, those a /metrics page exports.

A dashboard panel that names a metric nobody exports draws nothing and raises no error, so the
compose-equivalent run checks the names. The PromQL side is tests/support/promql.py (shared with
tests/unit/common/test_dashboard_alerts.py, which checks the same names against the registries).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable

from tests.support import promql


def promql_metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (functions, labels, keywords and variables excluded):
    the one implementation, tests/support/promql.py, which the dashboard and alert unit tests use too."""
    return promql.metric_names(expr)


def dashboard_metric_names(path: Path) -> dict[str, set[str]]:
    """{metric name: where on the dashboard it is used (panel and query, or variable)} for one file."""
    return promql.dashboard_metric_names(json.loads(path.read_text()))


# No `_created`: no service exports it (services/common/observe/process_metrics.py), so a dashboard that used it
# would draw nothing, and this check says so.
_TYPE_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("_sum", "_count"),
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
