"""Prometheus metrics under SGLang's names (`sglang:*`, label `model_name`) plus `simworker:*`.

Gauges and counters are read from `engine.stats()` at scrape time (recompute from a fresh
snapshot; nothing is incremented on the token path). The latency histograms are observed
by the HTTP layer in *virtual* seconds, i.e. what the simulated GPU server would show
regardless of `--speedup`: TTFT once per request, ITL once per delivered chunk (divided by
the tokens in it, as SGLang does), e2e once per request.
"""

from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.common.observe.process_metrics import register_process_metrics
from services.simworker.core.api import EngineStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_TTFT_BUCKETS_S = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    15.0,
    20.0,
    30.0,
    60.0,
    120.0,
    300.0,
)
_ITL_BUCKETS_S = (
    0.002,
    0.004,
    0.006,
    0.008,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.035,
    0.04,
    0.06,
    0.08,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.0,
)
_E2E_BUCKETS_S = (
    0.1,
    0.25,
    0.5,
    1.0,
    2.0,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    90.0,
    120.0,
    180.0,
    300.0,
    600.0,
    1200.0,
)

# (metric name, help, EngineStats attribute)
_GAUGES = (
    ("sglang:num_running_reqs", "Number of running requests", "num_running_reqs"),
    ("sglang:num_queue_reqs", "Number of requests in the waiting queue", "num_queue_reqs"),
    ("sglang:num_used_tokens", "Number of KV tokens in use", "num_used_tokens"),
    ("sglang:token_usage", "KV token usage (0..1)", "token_usage"),
    ("sglang:cache_hit_rate", "Prefix cache hit rate over a recent window", "cache_hit_rate"),
    ("sglang:gen_throughput", "Generation throughput (tokens/s)", "gen_throughput"),
    ("sglang:hicache_host_used_tokens", "HiCache host pool tokens in use", "host_used_tokens"),
    ("sglang:hicache_host_total_tokens", "HiCache host pool capacity in tokens", "host_total_tokens"),
)
# Counter families: name without the _total suffix (prometheus_client appends it).
_COUNTERS = (
    ("sglang:prompt_tokens", "Prompt tokens processed", "prompt_tokens_total"),
    ("sglang:generation_tokens", "Generated tokens", "generation_tokens_total"),
    ("sglang:cached_tokens", "Prompt tokens served from the prefix cache (GPU or host)", "cached_tokens_total"),
    ("sglang:num_requests", "Requests finished", "requests_total"),
    ("sglang:num_aborted_requests", "Requests aborted", "aborted_requests_total"),
    (
        "simworker:recomputed_tokens",
        "Prefill tokens this engine had computed before for the same prefix",
        "recomputed_tokens_total",
    ),
    ("simworker:retractions", "Decode retractions under KV pressure", "retractions_total"),
    (
        "simworker:priority_preemptions",
        "Running requests preempted for a higher-priority queued one",
        "preemptions_total",
    ),
    ("simworker:host_loadbacks", "Requests that loaded a prefix back from the host tier", "host_loadbacks_total"),
    ("simworker:host_loadback_tokens", "Tokens loaded back from the host tier", "host_loadback_tokens_total"),
    ("simworker:host_cached_tokens", "Cached prompt tokens that came from the host tier", "host_cached_tokens_total"),
    ("simworker:evicted_tokens", "Tokens evicted from the GPU pool", "evicted_tokens_total"),
)


class _EngineCollector(Collector):
    def __init__(self, stats: Callable[[], EngineStats], model_name: str) -> None:
        self._stats = stats
        self._model_name = model_name

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        for name, help_text, attr in _GAUGES:
            family = GaugeMetricFamily(name, help_text, labels=("model_name",))
            family.add_metric((self._model_name,), float(getattr(stats, attr)))
            yield family
        for name, help_text, attr in _COUNTERS:
            counter = CounterMetricFamily(name, help_text, labels=("model_name",))
            counter.add_metric((self._model_name,), float(getattr(stats, attr)))
            yield counter


class SimWorkerMetrics:
    """One registry per server, so several in-process servers never share series."""

    def __init__(self, stats: Callable[[], EngineStats], model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        register_process_metrics(self.registry, "simworker")
        self.registry.register(_EngineCollector(stats, model_name))
        labels = ("model_name",)
        self._ttft = Histogram(
            "sglang:time_to_first_token_seconds",
            "Time to first token (virtual seconds)",
            labels,
            buckets=_TTFT_BUCKETS_S,
            registry=self.registry,
        ).labels(model_name)
        self._itl = Histogram(
            "sglang:inter_token_latency_seconds",
            "Inter-token latency (virtual seconds)",
            labels,
            buckets=_ITL_BUCKETS_S,
            registry=self.registry,
        ).labels(model_name)
        self._e2e = Histogram(
            "sglang:e2e_request_latency_seconds",
            "End-to-end request latency (virtual seconds)",
            labels,
            buckets=_E2E_BUCKETS_S,
            registry=self.registry,
        ).labels(model_name)

    def observe_ttft(self, seconds: float) -> None:
        self._ttft.observe(seconds)

    def observe_itl(self, interval_s: float, num_tokens: int) -> None:
        if num_tokens > 0:
            self._itl.observe(interval_s / num_tokens)

    def observe_e2e(self, seconds: float) -> None:
        self._e2e.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
