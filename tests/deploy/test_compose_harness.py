"""The pieces the compose-equivalent run stands on, tested alone: hostname rewriting, the plan built from
the compose file, PromQL and exposition metric names, and the container health probe."""

from __future__ import annotations

import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.common.serve import healthcheck
from tests.deploy import compose_harness as ch
from tests.deploy.metric_names import exported_metric_names, missing_metrics, promql_metric_names

ADDRESSES = {"capacity": "127.0.9.10", "redis": "127.0.9.11", "router-1": "127.0.9.12", "router-10": "127.0.9.13"}


@pytest.mark.parametrize(
    "value, expected",
    [
        ("capacity:50051", "127.0.9.10:50051"),
        ("http://router-1:8000", "http://127.0.9.12:8000"),
        ("http://router-10:9103,http://router-1:9103", "http://127.0.9.13:9103,http://127.0.9.12:9103"),
        ("redis://redis:6379/1", "redis://127.0.9.11:6379/1"),
        ("0.0.0.0:50053", "127.0.9.99:50053"),
        ("0.0.0.0", "127.0.9.99"),
        ("http://127.0.0.1:8000/health", "http://127.0.9.99:8000/health"),
        ("grpc://localhost:50051", "grpc://127.0.9.99:50051"),
        ("redis", "redis"),  # a word, not a host
        ("/var/lib/capacity/x", "/var/lib/capacity/x"),  # a path, not a host
        ("my-capacity:1", "my-capacity:1"),  # another name that ends the same
        ("/data/planner.sqlite3", "/tmp/vol/planner.sqlite3"),
    ],
)
def test_rewriter_maps_container_strings_to_this_machine(value, expected):
    rewrite = ch.Rewriter("127.0.9.99", ADDRESSES, {"/data": Path("/tmp/vol")})
    assert rewrite(value) == expected


@pytest.mark.parametrize("text, seconds", [("10s", 10), ("1m30s", 90), ("500ms", 0.5), (None, 7.0)])
def test_compose_durations(text, seconds):
    assert ch.duration_seconds(text, 7.0) == pytest.approx(seconds)


def test_plan_of_the_compose_file(tmp_path):
    stack = ch.plan(ch.load_compose(), tmp_path, 42)
    assert set(stack.addresses.values()) == {f"127.0.42.{10 + i}" for i in range(len(stack.addresses))}
    router = stack.services["router-1"]
    assert router.argv[3:5] == ["--listen", f"{router.address}:50053"]
    assert router.env["BANDMASTER_ROUTER_SCHEDULER_ADDR"] == (
        f"{stack.addresses['scheduler']}:50052,{stack.addresses['scheduler-2']}:50052"
    )
    assert router.depends_on_healthy == ["capacity", "scheduler"]
    assert router.healthcheck[-2:] == [f"http://{router.address}:8000/health", f"grpc://{router.address}:50053"]
    assert stack.dropped_env["router-1"] == ["OTEL_EXPORTER_OTLP_ENDPOINT"]
    planner = stack.services["planner"]
    assert planner.env["BANDMASTER_PLANNER_REGISTRY_PATH"] == str(
        tmp_path / "volumes" / "planner-data" / "planner.sqlite3"
    )
    redis = stack.services["redis"]
    assert redis.argv[-8:] == [
        "--bind",
        redis.address,
        "--port",
        "6379",
        "--dir",
        str(tmp_path / "redis"),
        "--protected-mode",
        "no",
    ]
    assert redis.healthcheck == ["redis-cli", "-h", redis.address, "-p", "6379", "ping"]


def test_no_simworkers_are_planned_with_real_workers(tmp_path):
    doc = ch.load_compose(env={"BANDMASTER_SIMWORKERS": "0", "BANDMASTER_WORKER_URLS": "http://gpu:30000"})
    stack = ch.plan(doc, tmp_path, 42)
    assert not [n for n in stack.services if n.startswith("simworker")]
    assert stack.services["capacity"].env["BANDMASTER_CAPACITY_WORKER_URLS"] == "http://gpu:30000"


@pytest.mark.parametrize(
    "expr, names",
    [
        (
            'sum by (worker_id) (rate(bandmaster_router_requests_total{path="program"}[$__rate_interval]))',
            {"bandmaster_router_requests_total"},
        ),
        (
            "histogram_quantile(0.99, sum(rate(sglang:time_to_first_token_seconds_bucket[5m])) by (le))",
            {"sglang:time_to_first_token_seconds_bucket"},
        ),
        ("a_used / ignoring(kind) group_left b_total > bool 0.95 offset 5m", {"a_used", "b_total"}),
        ('label_replace(up{job="x"}, "dst", "$1", "instance", "(.*)")', {"up"}),
        ("sum(x) / clamp_min(sum(y_count), 1) * 100", {"x", "y_count"}),
        ("max(z) without (instance) or vector(0)", {"z"}),
        ("1 - (c_seconds_sum / c_seconds_count)", {"c_seconds_sum", "c_seconds_count"}),
    ],
)
def test_promql_metric_names(expr, names):
    assert promql_metric_names(expr) == names


def test_exported_names_include_what_each_type_produces():
    exposition = "\n".join(
        [
            "# HELP r Requests",
            "# TYPE r counter",
            'r_total{path="program"} 3.0',
            "# TYPE lat histogram",  # no child yet: no samples, still queryable
            "# TYPE g gauge",
            "g 1.0",
            "sglang:token_usage 0.5",
        ]
    )
    names = exported_metric_names(exposition)
    assert {"r_total", "lat_bucket", "lat_sum", "lat_count", "g", "sglang:token_usage"} <= names
    assert missing_metrics({"r_total": {"e"}, "nope": {"e2"}}, names) == {"nope": {"e2"}}


# --- the container health probe -------------------------------------------------------------------


@pytest.fixture
def grpc_health() -> Iterator[tuple[str, health.HealthServicer]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        server.stop(None)


@pytest.fixture
def http_health() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the http.server name)
            self.send_response(200 if self.path == "/health" else 503)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_probe_follows_grpc_serving_status(grpc_health):
    address, servicer = grpc_health
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    assert healthcheck.run([f"grpc://{address}"], {})[0] == 0
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    code, results = healthcheck.run([f"grpc://{address}"], {})
    assert code == 1 and results[0].detail == "NOT_SERVING"


def test_probe_http_and_every_target_must_pass(grpc_health, http_health):
    address, servicer = grpc_health
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    assert healthcheck.run([f"{http_health}/health", f"grpc://{address}"], {})[0] == 0
    code, results = healthcheck.run([f"{http_health}/other", f"grpc://{address}"], {})
    assert code == 1 and [r.healthy for r in results] == [False, True] and results[0].detail == "HTTP 503"


def test_probe_reads_targets_from_the_environment(http_health):
    assert healthcheck.run([], {healthcheck.ENV_TARGETS: f"{http_health}/health"})[0] == 0


@pytest.mark.parametrize("argv", [[], ["tcp://x:1"], ["http://no-port/health"], ["--bogus"]])
def test_probe_usage_errors_exit_1_never_2(argv):
    # Docker reserves a HEALTHCHECK's exit status 2.
    assert healthcheck.run(argv, {}) == (1, [])


def test_probe_of_nothing_listening_is_unhealthy_within_its_deadline():
    code, results = healthcheck.run(["grpc://127.0.0.1:1", "http://127.0.0.1:1/health", "--timeout-seconds", "1"], {})
    assert code == 1 and not any(r.healthy for r in results)
