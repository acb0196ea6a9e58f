"""Tracing a turn with no collector: `bandmaster up --trace-dir DIR` gives every process a span file, one turn
is played through the router, and `bandmaster trace` prints that turn's tree, merged from the router's, the
scheduler's and the worker's files. Background spans (ticks, recomputes) stay out of the files by default."""

import json
import signal
import urllib.request

from tests.support.eventually import wait_until
from tests.support.processes import base_env, python_module, run_module, start


def _names(path) -> list[str]:
    if not path.exists():
        return []
    return [json.loads(line)["name"] for line in path.read_text().splitlines() if line.strip()]


def test_bandmaster_trace_prints_one_turn_from_the_span_files_of_up(tmp_path):
    state, traces, registry = tmp_path / "state", tmp_path / "traces", tmp_path / "clusters"
    argv = python_module(
        "services.cli",
        "up",
        "--workers",
        "1",
        "--worker-kv-tokens",
        "8192",
        "--speedup",
        "20",
        "--ports",
        "auto",
        "--no-planner",
        "--state-dir",
        str(state),
        "--trace-dir",
        str(traces),
    )
    env = base_env(BANDMASTER_CLUSTERS_DIR=str(registry))
    with start("bandmaster-up", argv, tmp_path, env=env) as proc:
        output = proc.wait_for_log("Ctrl-C to stop", timeout_s=90)
        assert f"traces: {traces}" in output, output
        record = json.loads((state / "cluster.json").read_text())
        assert record["trace_dir"] == str(traces)
        body = json.dumps(
            {"model": "bandmaster-sim", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
        ).encode()
        request = urllib.request.Request(
            record["http_url"] + "/v1/chat/completions",
            data=body,
            headers={"Content-Type": "application/json", "X-Dynamo-Session-ID": "prog-7"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200
        # Written by each process's batch thread within a second or so.
        wait_until(
            lambda: (
                "router.request" in _names(traces / "router.jsonl")
                and "scheduler.admit" in _names(traces / "scheduler.jsonl")
                and "POST /v1/chat/completions" in _names(traces / "simworker-0.jsonl")
            ),
            timeout_s=20,
            interval_s=0.2,
            message="the turn's spans were not written",
        )
        # No --dir: the running cluster's trace dir, from its discovery record.
        shown = run_module("services.cli", "trace", "--session-id", "prog-7", "--turn", "1", env=env)
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.splitlines()
        assert lines[0].startswith("trace ") and "session_id=prog-7" in lines[0], shown.stdout
        tree = "\n".join(lines[1:])
        assert lines[1].startswith("router.request ") and " router " in lines[1], shown.stdout
        for name, service in (
            ("router.admit", "router"),
            ("scheduler.admit", "scheduler"),
            ("router.pick", "router"),
            ("router.upstream", "router"),
            ("POST /v1/chat/completions", "simworker"),
        ):
            (line,) = [row for row in lines[1:] if f"─ {name} " in row]
            assert f" {service} " in line and line.rstrip().endswith("ms"), tree
        # The worker's span is nested under router.upstream, the scheduler's under router.admit.
        upstream = next(i for i, row in enumerate(lines) if "router.upstream" in row)
        assert "POST /v1/chat/completions" in lines[upstream + 1], tree
        admit = next(i for i, row in enumerate(lines) if "router.admit" in row)
        assert "scheduler.admit" in lines[admit + 1], tree
        last = run_module("services.cli", "trace", "--dir", str(traces), "--last", env=env)
        assert last.returncode == 0 and last.stdout.splitlines()[0] == lines[0], last.stderr
        proc.send_signal(signal.SIGTERM)
        assert proc.wait_exit(60) == 0, proc.log_text()
    # Only turn spans: the scheduler's ticks and capacity's recomputes (many by now) were left out.
    background = {"scheduler.tick", "capacity.recompute"}
    assert not background & {n for f in traces.glob("*.jsonl") for n in _names(f)}
