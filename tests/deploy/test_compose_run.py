"""The compose-equivalent run: docker-compose.yml started service for service as local processes
(tests/deploy/compose_harness.py says how), then used as a user would use the compose cluster:

* an agent program of several turns with `X-Dynamo-Session-ID`, alternating between router-1 and
  router-2 (the routers hold no state of their own), ending with `X-Dynamo-Session-Final`;
* an OpenAI Batch API job through router-1 (files upload, batches create, completed, its output read);
* every Prometheus target of deploy/compose/prometheus.yml that is a started service answers /metrics,
  and every metric the Grafana dashboard queries is exported by one of them.

The stack is started once for the module, within a bounded time, and always stopped.
"""

from __future__ import annotations

import io
import json
import shutil
import time
import urllib.request
from typing import Iterator

import openai
import pytest
import redis
import yaml

from tests.deploy import compose_harness as ch
from tests.deploy.metric_names import dashboard_metric_names, exported_metric_names, missing_metrics

pytestmark = pytest.mark.integration

DASHBOARD = ch.ROOT / "deploy" / "grafana" / "dashboards" / "bandmaster.json"
PROMETHEUS = ch.ROOT / "deploy" / "compose" / "prometheus.yml"
MODEL = "bandmaster-sim"
STARTUP_TIMEOUT_S = 90.0
BATCH_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ch.ComposeRun]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (make test installs it through `make system-deps`)")
    with ch.compose_stack(tmp_path_factory.mktemp("compose"), timeout_s=STARTUP_TIMEOUT_S) as run:
        yield run


def client(
    stack: ch.ComposeRun, router: str, headers: dict[str, str] | None = None, api_key: str = "none"
) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=stack.url(router, 8000, "/v1"),
        api_key=api_key,
        max_retries=0,
        timeout=REQUEST_TIMEOUT_S,
        default_headers=headers or {},
    )


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def sample(text: str, name: str, label_fragment: str = "") -> float:
    """Sum of the samples of `name` whose labels contain `label_fragment`."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " ") and label_fragment in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_the_stack_is_what_the_compose_file_says(stack):
    assert set(stack.stack.services) == {
        "simworker-1",
        "simworker-2",
        "capacity",
        "scheduler",
        "scheduler-2",
        "router-1",
        "router-2",
        "planner",
        "batch",
        "redis",
    }
    assert set(stack.stack.schema_only) == {"otel-collector", "jaeger", "prometheus", "grafana"}
    # Traces would go to the collector, which runs only in Docker: the variable is left out here.
    assert all(keys == ["OTEL_EXPORTER_OTLP_ENDPOINT"] for keys in stack.stack.dropped_env.values())
    assert stack.stack.services["capacity"].env["BANDMASTER_CAPACITY_WORKER_URLS"] == ",".join(
        f"http://{stack.stack.addresses[w]}:30000" for w in ("simworker-1", "simworker-2")
    )
    for name, item in stack.running.items():
        assert item.healthy and item.process.running, name


def agent_program(stack: ch.ComposeRun, program: str, api_key: str = "none") -> None:
    """Four turns alternating router-1 and router-2, then the final request on router-2."""
    messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test in tests/test_math.py."},
    ]
    routers = ["router-1", "router-2"]
    for turn in range(4):
        answer = client(stack, routers[turn % 2], {"X-Dynamo-Session-ID": program}, api_key).chat.completions.create(
            model=MODEL, messages=messages, max_tokens=8
        )
        assert answer.choices[0].message.content, f"turn {turn} came back empty"
        assert answer.usage.prompt_tokens > 0 and answer.usage.completion_tokens > 0
        messages += [
            {"role": "assistant", "content": answer.choices[0].message.content},
            {"role": "user", "content": f"tool output {turn}: 1 passed"},
        ]
    final = client(stack, "router-2", {"X-Dynamo-Session-ID": program, "X-Dynamo-Session-Final": "true"}, api_key)
    final.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)


def test_agent_program_across_both_routers(stack):
    agent_program(stack, "compose-agent-1")
    routers = ["router-1", "router-2"]
    served = {
        r: sample(scrape(stack.url(r, 9103, "/metrics")), "bandmaster_router_requests_total", 'path="program"')
        for r in routers
    }
    assert all(count >= 2 for count in served.values()), f"program turns per router: {served}"
    # Two schedulers, active and standby: the leader keeps the program table in the compose file's Redis
    # (its store is up and has been written); the standby writes nothing.
    schedulers = [scrape(stack.url(name, 9102, "/metrics")) for name in ("scheduler", "scheduler-2")]
    leaders = [m for m in schedulers if sample(m, "bandmaster_scheduler_leader") == 1]
    assert len(leaders) == 1, "not exactly one leading scheduler"
    assert sample(leaders[0], "bandmaster_scheduler_state_store_up") == 1
    assert sample(leaders[0], "bandmaster_scheduler_state_writes_total") > 0
    state = redis.Redis(host=stack.stack.addresses["redis"], port=6379, db=1, socket_timeout=5)
    try:
        assert state.keys("bandmaster:scheduler:*"), "no scheduler state in Redis db 1"
    finally:
        state.close()


def batch_input(n: int) -> bytes:
    lines = [
        json.dumps(
            {
                "custom_id": f"req-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": MODEL,
                    "max_tokens": 4,
                    "messages": [{"role": "user", "content": f"summarise file {i}"}],
                },
            }
        )
        for i in range(n)
    ]
    return ("\n".join(lines) + "\n").encode()


def run_batch(stack: ch.ComposeRun, api_key: str = "none", n: int = 3) -> None:
    """Upload n requests, create a batch through router-1, wait for it, check its output file."""
    api = client(stack, "router-1", api_key=api_key)
    upload = api.files.create(file=("batch.jsonl", io.BytesIO(batch_input(n))), purpose="batch")
    batch = api.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.monotonic() + BATCH_TIMEOUT_S
    while batch.status != "completed":
        assert batch.status not in ("failed", "expired", "cancelled"), batch
        assert time.monotonic() < deadline, (
            f"batch {batch.id} still {batch.status} after {BATCH_TIMEOUT_S:g}s "
            f"({batch.request_counts}); batch service log:\n"
            f"{stack.running['batch'].process.log_tail(25)}"
        )
        time.sleep(0.5)
        batch = api.batches.retrieve(batch.id)
    assert batch.request_counts.completed == n and batch.request_counts.failed == 0
    lines = [json.loads(line) for line in api.files.content(batch.output_file_id).text.splitlines()]
    assert sorted(line["custom_id"] for line in lines) == sorted(f"req-{i}" for i in range(n))
    assert all(line["response"]["status_code"] == 200 for line in lines)


def test_batch_through_the_router(stack):
    run_batch(stack)
    # The planner publishes its drain lease to the compose file's Redis (db 0, its default key).
    leases = redis.Redis(host=stack.stack.addresses["redis"], port=6379, db=0, socket_timeout=5)
    try:
        assert leases.hgetall("bandmaster:drain-limit:default"), "no drain lease in Redis"
    finally:
        leases.close()


def prometheus_targets(stack: ch.ComposeRun) -> tuple[dict[str, str], list[str]]:
    """{'job/target': scrape URL} for each target that is a started service; the others by name."""
    config = yaml.safe_load(PROMETHEUS.read_text())
    urls: dict[str, str] = {}
    skipped: list[str] = []
    for job in config["scrape_configs"]:
        path = job.get("metrics_path", "/metrics")
        for sc in job.get("static_configs", []):
            for target in sc["targets"]:
                resolved = stack.resolve(target)
                if resolved is None:
                    skipped.append(f"{job['job_name']}/{target}")
                else:
                    urls[f"{job['job_name']}/{target}"] = f"http://{resolved}{path}"
    return urls, skipped


def test_prometheus_targets_answer_and_the_dashboard_queries_exported_metrics(stack):
    urls, skipped = prometheus_targets(stack)
    assert sorted(skipped) == ["otel-collector/otel-collector:8888", "prometheus/localhost:9090"]
    exported: set[str] = set()
    for target, url in urls.items():
        names = exported_metric_names(scrape(url))
        assert names, f"{target} ({url}) exports no metric"
        exported |= names
    scraped_hosts = {t.split("/", 1)[1].rsplit(":", 1)[0] for t in urls}
    started = {n for n, s in stack.stack.services.items() if s.kind == "bandmaster"}
    assert scraped_hosts == started, f"Prometheus scrapes {scraped_hosts}, the stack runs {started}"
    used = dashboard_metric_names(DASHBOARD)
    assert used, "the dashboard has no PromQL expr"
    missing = missing_metrics(used, exported)
    assert not missing, "dashboard queries name metrics no service exports:\n" + "\n".join(
        f"  {name}: {sorted(exprs)[0]}" for name, exprs in sorted(missing.items())
    )
