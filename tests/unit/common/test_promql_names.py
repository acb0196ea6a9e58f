"""tests/support/promql.py: which metric names a PromQL expression reads."""

from __future__ import annotations

import pytest

from tests.support.promql import dashboard_metric_names, metric_names, rule_exprs, template_metric_names


@pytest.mark.parametrize(
    "expr, names",
    [
        ("up == 0", {"up"}),
        ("bandmaster_router_scheduler_reachable == 0", {"bandmaster_router_scheduler_reachable"}),
        (
            'sum by (le, traffic) (rate(bandmaster_router_ttft_seconds_bucket{traffic="online"}[5m]))',
            {"bandmaster_router_ttft_seconds_bucket"},
        ),
        (
            "histogram_quantile(0.95, sum by (le) (rate(sglang:inter_token_latency_seconds_bucket[$__rate_interval])))",
            {"sglang:inter_token_latency_seconds_bucket"},
        ),
        ("sum(rate(a_total[5m])) / clamp_min(sum(rate(b_total[5m])), 1e-9) > 0.05", {"a_total", "b_total"}),
        ("x > 0 and on () sum(increase(y_total[15m])) == 0", {"x", "y_total"}),
        ("a * on (worker_id, dp_rank) group_left (band) b", {"a", "b"}),
        ("sum without (instance) (a) unless ignoring (job) b", {"a", "b"}),
        ("max(a offset 5m) or vector(0)", {"a"}),
        ("rate(a[5m:30s] @ end())", {"a"}),
        ('label_replace(a, "dst", "$1", "src", "(.*)")', {"a"}),
        ('a{worker_id=~"$worker", band="pause"} + ${var} * 2', {"a"}),
        ("a > bool Inf or b < -NaN", {"a", "b"}),
        ("a_valid_until_seconds < time()", {"a_valid_until_seconds"}),
        ('a{job="by (x)"}', {"a"}),
        ("absent(a_count)", {"a_count"}),
    ],
)
def test_metric_names(expr, names):
    assert metric_names(expr) == names


def test_name_selectors_are_refused_rather_than_missed():
    with pytest.raises(ValueError):
        metric_names('{__name__=~"bandmaster_.*"}')


@pytest.mark.parametrize(
    "query, names",
    [
        (
            "label_values(bandmaster_scheduler_replica_utilization, worker_id)",
            {"bandmaster_scheduler_replica_utilization"},
        ),
        ('label_values(a{job="x"}, instance)', {"a"}),
        ("query_result(topk(3, a))", {"a"}),
    ],
)
def test_template_queries(query, names):
    assert template_metric_names(query) == names


def test_dashboard_names_cover_nested_rows_and_variables():
    dashboard = {
        "panels": [
            {"type": "timeseries", "title": "t", "targets": [{"refId": "A", "expr": "rate(a_total[1m])"}]},
            {
                "type": "row",
                "title": "r",
                "panels": [{"type": "stat", "title": "s", "targets": [{"refId": "A", "expr": "b"}]}],
            },
        ],
        "templating": {
            "list": [
                {"type": "query", "name": "v", "query": {"query": "label_values(c, worker_id)"}},
                {"type": "datasource", "name": "DS", "query": "prometheus"},
            ]
        },
    }
    assert set(dashboard_metric_names(dashboard)) == {"a_total", "b", "c"}


def test_rule_exprs():
    rules = {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "x == 0"}, {"record": "r:y", "expr": "y"}]}]}
    assert rule_exprs(rules) == [("A", "x == 0"), ("r:y", "y")]
