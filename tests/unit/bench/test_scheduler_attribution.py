"""The scheduler bench's attribution: py-spy samples split into the parts of an Admit+Complete."""

from bench.scheduler_bench import NATIVE_LOOP, attribute_stacks, proc_sample

ROOT = "<module> (services/scheduler/__main__.py:22);run (uvloop/__init__.py:92);Runner.run (asyncio/runners.py:118)"
SERVICER = ROOT + ";SchedulerServicer._admit (services/scheduler/servicer.py:184)"


def test_each_sample_counts_for_its_innermost_known_frame():
    raw = "\n".join(
        [
            f"{ROOT} 50",  # nothing under the loop: native gRPC / loop work
            f"{SERVICER};SchedulerCore.admit (services/scheduler/core/scheduler.py:214) 20",
            f"{SERVICER};Tracer.start_span (trace/__init__.py:1200) 10",
            # contextlib belongs to no part: the servicer that called it gets the sample
            f"{SERVICER};_GeneratorContextManager.__exit__ (contextlib.py:144) 10",
            "Thread.run (threading.py:982);SqliteStateStore._write (services/scheduler/adapters/state_store.py:400) 5",
            "Thread.run (threading.py:982) 5",
            "malformed line without a count",
        ]
    )
    report = attribute_stacks(raw)
    assert report["samples"] == 100
    share = report["share"]
    assert share[NATIVE_LOOP] == 0.5
    assert share["decision (scheduler core)"] == 0.2
    assert share["tracing (OpenTelemetry spans, context, interceptor)"] == 0.1
    assert share["servicer shell (validation, conversion, runtime, guards)"] == 0.1
    assert share["durable write-through (persist, store)"] == 0.05
    assert share["gRPC poller thread (native)"] == 0.05
    assert list(share)[0] == NATIVE_LOOP  # largest first


def test_no_samples_gives_no_shares():
    assert attribute_stacks("") == {"samples": 0, "share": {}}


def test_proc_sample_reads_this_process():
    import os

    sample = proc_sample(os.getpid())
    assert sample["cpu_s"] > 0 and sample["hwm_kb"] >= sample["rss_kb"] > 0
