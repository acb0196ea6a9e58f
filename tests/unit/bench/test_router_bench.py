"""bench.router_bench's reading of a router's /metrics and its statement of issue 20's targets."""

from __future__ import annotations

import math

from bench.router_bench import ARMS, lag_p99_s, phase_order, router_phase, targets


def test_the_lag_p99_is_the_bound_of_the_bucket_that_holds_it():
    buckets = {"lag_le:0.005": 900.0, "lag_le:0.01": 985.0, "lag_le:0.1": 995.0, "lag_le:1.0": 1000.0}
    assert lag_p99_s({**buckets, "lag_le:+Inf": 1000.0}) == 0.1
    assert lag_p99_s({"lag_le:0.005": 1000.0, "lag_le:+Inf": 1000.0}) == 0.005
    assert lag_p99_s({"lag_le:1.0": 0.0, "lag_le:+Inf": 10.0}) == math.inf
    assert math.isnan(lag_p99_s({}))


def test_a_phase_is_the_difference_of_the_counters_around_it():
    before = {"fail_open:no_answer": 2.0, "deadline_extended": 1.0, "lag_le:0.1": 10.0, "lag_le:+Inf": 10.0}
    after = {
        "fail_open:no_answer": 5.0,
        "fail_open:outage": 1.0,
        "deadline_extended": 4.0,
        "lag_le:0.1": 110.0,
        "lag_le:+Inf": 110.0,
    }
    phase = router_phase(before, after)
    assert phase["fail_open"] == 4 and phase["fail_open_by_reason"] == {"no_answer": 3.0, "outage": 1.0}
    assert phase["deadline_extended"] == 3 and phase["loop_lag_samples"] == 100 and phase["loop_lag_p99_s"] == 0.1


def _row(ttft_p50: float, cpu: float, fail_open: dict | None = None, lag: float = 0.05) -> dict:
    row = {"ttft_ms": {"p50": ttft_p50}, "proxy_cpu_ms_per_1k_tokens": cpu, "vs_direct": {}}
    if fail_open is not None:
        row["router"] = {"fail_open_by_reason": fail_open, "loop_lag_p99_s": lag}
    return row


def test_targets_judge_the_scheduled_arms_and_every_fail_open_at_256():
    at64 = {"direct": _row(50, 0), "bandmaster": _row(58, 30, {}), "sglang-router": _row(55, 20)}
    at64["bandmaster"]["vs_direct"] = {"added_ttft_ms_p50": 8.0}
    at256 = {
        "bandmaster": _row(300, 30, {"no_answer": 2.0}, lag=0.25),
        "bandmaster-2proc": _row(200, 30, {"unreachable": 1.0}, lag=0.05),
    }
    got = targets({"64": at64, "256": at256})
    assert got["added_ttft_p50_ms_at_64"]["met"] and got["added_ttft_p50_ms_at_64"]["value"] == 8.0
    assert got["cpu_per_token_vs_sglang_router_at_64"] == {"target": "<= 1.0", "value": 1.5, "met": False}
    assert got["bandmaster_fail_open_at_256"]["value"] == 2 and not got["bandmaster_fail_open_at_256"]["met"]
    assert got["bandmaster-2proc_fail_open_at_256"]["value"] == 1  # the bench's scheduler is never down
    assert not got["bandmaster_loop_lag_p99_s_at_256"]["met"] and got["bandmaster-2proc_loop_lag_p99_s_at_256"]["met"]
    assert targets({"8": at64}) == {}


def test_phases_alternate_the_order_of_the_chosen_arms():
    order = phase_order(2, [64], ("direct", "bandmaster"))
    assert [arm for _, _, arm in order] == ["direct", "bandmaster", "bandmaster", "direct"]
    assert len(phase_order(1, [64, 256])) == 2 * len(ARMS)
