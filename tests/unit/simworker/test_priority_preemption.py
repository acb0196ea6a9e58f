"""SimEngine's priority preemption: SGLang's `preempt_to_schedule` with priority scheduling on.

A queued request that finds the running set full (`max_running_requests`) preempts decoding
requests whose priority it beats by more than `priority_scheduling_preemption_threshold`, least
important first and the most recent among equals, only when their output reservations cover its
memory demand. Short of memory alone, it waits as without priorities.
"""

from __future__ import annotations

import pytest

from services.common.settings.errors import ConfigError
from services.simworker.core.api import EngineConfig, EngineRequest

from .helpers import Run, assert_no_leak, make_engine, prompt


def req(rid, n_prompt, out, priority, base):
    return EngineRequest(rid, prompt(n_prompt, base), out, ignore_eos=True, priority=priority)


def one_slot(**config):
    config.setdefault("enable_priority_scheduling", True)
    return Run(make_engine(page_size=4, max_total_tokens=4096, max_running_requests=1, **config))


def running_ids(run):
    return [r.rid for r in run.engine._running]


def waiting_ids(run):
    return [r.rid for r in run.engine._waiting]


def test_a_request_that_beats_the_running_one_by_more_than_the_threshold_takes_its_slot():
    run = one_slot()
    run.submit(req("low", 8, 20, 0, 100))
    run.step()
    run.step()
    run.submit(req("high", 8, 5, 11, 200))
    run.step()
    assert running_ids(run) == ["high"] and waiting_ids(run) == ["low"]
    stats = run.engine.stats()
    assert stats.preemptions_total == 1 and stats.retractions_total == 0
    run.drain()
    assert run.finish_order == ["high", "low"]
    assert run.final("low").completion_tokens == 20 and len(run.tokens("low")) == 20
    assert run.final("low").num_retractions == 0  # a preemption is not a decode retraction
    assert_no_leak(run.engine)


@pytest.mark.parametrize(
    "config, high",
    [
        ({}, 10),  # a difference equal to the threshold is not enough
        ({"disable_priority_preemption": True}, 50),
        ({"enable_priority_scheduling": False}, 50),
        ({"priority_scheduling_preemption_threshold": 60}, 50),
    ],
)
def test_no_preemption(config, high):
    run = one_slot(**config)
    run.submit(req("low", 8, 20, 0, 100))
    run.step()
    run.submit(req("high", 8, 5, high, 200))
    run.step()
    assert running_ids(run) == ["low"]
    run.drain()
    assert run.finish_order == ["low", "high"]
    assert run.engine.stats().preemptions_total == 0


def test_low_values_first_preempts_the_larger_value():
    run = one_slot(schedule_low_priority_values_first=True)
    run.submit(req("batch", 8, 20, 11, 100))
    run.step()
    run.submit(req("online", 8, 5, 0, 200))
    run.step()
    assert running_ids(run) == ["online"]
    assert run.engine.stats().preemptions_total == 1


def full_run(max_running=3):
    # 64 pages of 4 tokens. Each 20-token prompt holds 5 pages and reserves ceil(60 * 0.7 / 4) = 11
    # for its output: three requests fill the running set (max_running_requests = 3); with more
    # slots a fourth (20 tokens + its reservation) would not fit in memory either.
    run = Run(
        make_engine(
            page_size=4, max_total_tokens=256, max_running_requests=max_running, enable_priority_scheduling=True
        )
    )
    run.submit(req("a", 20, 60, 0, 1000))
    run.submit(req("b", 20, 60, 0, 2000))
    run.submit(req("c", 20, 60, 5, 3000))
    run.step()
    run.step()
    assert sorted(running_ids(run)) == ["a", "b", "c"]
    return run


def test_preemption_takes_the_least_important_and_most_recent_first():
    run = full_run()
    run.submit(req("h", 20, 60, 20, 4000))
    decoded_before = {r.rid: r.generated for r in run.engine._running}
    run.step()
    # b and a have the lowest priority; b arrived last. One reservation covers h's memory demand.
    assert waiting_ids(run) == ["b"]
    assert sorted(running_ids(run)) == ["a", "c", "h"]
    assert run.engine._by_rid["b"].generated == decoded_before["b"]  # it decoded nothing in that step
    assert run.engine.stats().preemptions_total == 1
    run.drain()
    for rid in "abch":
        assert run.final(rid).completion_tokens == 60
    assert_no_leak(run.engine)


def test_preempted_output_is_the_output_it_would_have_had():
    roomy = Run(make_engine(page_size=4, max_total_tokens=8192, enable_priority_scheduling=True))
    roomy.submit(req("b", 20, 60, 0, 2000))
    roomy.drain()
    run = full_run()
    run.submit(req("h", 20, 60, 20, 4000))
    run.drain()
    assert run.engine.stats().preemptions_total == 1
    assert run.tokens("b") == roomy.tokens("b")


def test_nobody_is_preempted_when_the_eligible_ones_cannot_cover_the_demand():
    run = full_run()
    # h beats only a and b (c is 5 below it, within the threshold), and needs far more than their
    # reservations: 40 prompt pages + its output.
    run.submit(req("h", 160, 60, 12, 4000))
    run.step()
    assert waiting_ids(run) == ["h"]
    assert run.engine.stats().preemptions_total == 0
    run.drain()
    assert_no_leak(run.engine)


def test_memory_alone_is_no_reason_to_preempt():
    """SGLang tries preemption only for a full running set: a request short of memory ends the
    admission pass and waits, whatever its priority."""
    run = full_run(max_running=256)
    run.submit(req("h", 20, 60, 20, 4000))
    run.step()
    assert waiting_ids(run) == ["h"] and sorted(running_ids(run)) == ["a", "b", "c"]
    assert run.engine.stats().preemptions_total == 0
    run.drain()
    assert run.finish_order[-1] == "h"
    assert_no_leak(run.engine)


def test_the_preemption_threshold_must_not_be_negative():
    with pytest.raises(ConfigError, match="priority_scheduling_preemption_threshold"):
        EngineConfig(priority_scheduling_preemption_threshold=-1)
