"""Flag/env mapping and validation of the simworker config (pure; no server)."""

from __future__ import annotations

import json

import pytest

from services.common.process.ready import write_ready_file
from services.common.settings.errors import ConfigError
from services.simworker.config import KvEventsConfig, load_config


def test_defaults():
    c = load_config([], {})
    assert (c.host, c.port, c.page_size, c.speedup) == ("127.0.0.1", 30000, 16, 1.0)
    assert c.served_model_name == c.model_path
    assert c.timing_profile == "glm45-fp8-h200"
    assert c.kv_events is None and c.enable_cache_report is False


@pytest.mark.parametrize(
    "argv, env, field, expected",
    [
        (["--port", "0"], {}, "port", 0),
        ([], {"SIMWORKER_PORT": "31000"}, "port", 31000),
        (["--port", "1"], {"SIMWORKER_PORT": "31000"}, "port", 1),
        (["--served-model-name", "m"], {}, "served_model_name", "m"),
        (["--model-name", "m"], {}, "served_model_name", "m"),
        (["--model-path", "org/x"], {}, "served_model_name", "org/x"),
        (["--enable-hierarchical-cache", "--hicache-ratio", "3"], {}, "hicache_ratio", 3.0),
        ([], {"SIMWORKER_ENABLE_CACHE_REPORT": "true"}, "enable_cache_report", True),
        (
            ["--timing-override", "decode_min_ms=2", "--timing-override", "frontend_base_ms=0"],
            {},
            "timing_overrides",
            {"decode_min_ms": 2.0, "frontend_base_ms": 0.0},
        ),
        ([], {"SIMWORKER_TIMING_OVERRIDE": "a=1,b=2.5"}, "timing_overrides", {"a": 1.0, "b": 2.5}),
        (["--speedup", "25"], {}, "speedup", 25.0),
        (
            ["--enable-priority-scheduling", "--schedule-low-priority-values-first"],
            {},
            "schedule_low_priority_values_first",
            True,
        ),
        (["--hicache-write-policy", "write_back"], {}, "hicache_write_policy", "write_back"),
        ([], {}, "priority_scheduling_preemption_threshold", 10),
        (["--priority-scheduling-preemption-threshold", "3"], {}, "priority_scheduling_preemption_threshold", 3),
        ([], {"SIMWORKER_DISABLE_PRIORITY_PREEMPTION": "1"}, "disable_priority_preemption", True),
    ],
)
def test_sources(argv, env, field, expected):
    assert getattr(load_config(argv, env), field) == expected


@pytest.mark.parametrize(
    "argv, field",
    [
        (["--speedup", "0"], "speedup"),
        (["--speedup", "-1"], "speedup"),
        (["--port", "70000"], "port"),
        (["--page-size", "0"], "page_size"),
        (["--max-total-tokens", "8", "--page-size", "16"], "max_total_tokens"),
        (["--stream-interval", "0"], "stream_interval"),
        (["--enable-hierarchical-cache", "--hicache-ratio", "1"], "hicache_ratio"),
        (["--hicache-size", "-1"], "hicache_size"),
        (["--hicache-storage-backend", "mooncake"], "hicache_storage_backend"),
        (["--schedule-low-priority-values-first"], "schedule_low_priority_values_first"),
        (["--priority-scheduling-preemption-threshold", "-1"], "priority_scheduling_preemption_threshold"),
        (["--hicache-write-policy", "sometimes"], "hicache_write_policy"),
        (["--model-name", "a", "--served-model-name", "b"], "model_name"),
        (["--timing-override", "nonsense"], "timing_override"),
        (["--timing-override", "x=abc"], "timing_override"),
        (["--kv-events-config", "{bad"], "kv_events_config"),
        (["--kv-events-config", '{"publisher": "kafka"}'], "kv_events_config.publisher"),
        (
            ["--kv-events-endpoint", "tcp://*:1", "--kv-events-config", '{"publisher":"zmq","endpoint":"tcp://*:2"}'],
            "kv_events_endpoint",
        ),
        (["--no-such-flag"], "argv"),
        (["--max-running-requests", "x"], "max_running_requests"),
    ],
)
def test_invalid_config_names_the_rule(argv, field):
    with pytest.raises(ConfigError) as err:
        load_config(argv, {})
    assert err.value.field == field
    assert err.value.reason


def test_kv_events_from_endpoint_and_json():
    c = load_config(["--kv-events-endpoint", "tcp://*:5557"], {})
    assert c.kv_events == KvEventsConfig(publisher="zmq", endpoint="tcp://*:5557")
    c = load_config(
        [
            "--kv-events-config",
            json.dumps(
                {
                    "publisher": "zmq",
                    "endpoint": "tcp://127.0.0.1:1",
                    "replay_endpoint": "tcp://*:2",
                    "topic": "kv",
                    "max_queue_size": 5,
                }
            ),
        ],
        {},
    )
    assert c.kv_events.endpoint == "tcp://127.0.0.1:1" and c.kv_events.replay_endpoint == "tcp://*:2"
    assert c.kv_events.topic == "kv"
    assert load_config(["--kv-events-config", '{"publisher": "null"}'], {}).kv_events is None


def test_hicache_size_gb_to_tokens():
    c = load_config(["--enable-hierarchical-cache", "--hicache-size", "2"], {})
    assert c.hicache_size_tokens(kv_bytes_per_token=1000) == 2_000_000
    assert load_config([], {}).hicache_size_tokens(1000) == 0


def test_ready_file_is_atomic_json(tmp_path):
    path = tmp_path / "ready.json"
    write_ready_file(str(path), {"port": 1234, "pid": 5})
    assert json.loads(path.read_text()) == {"port": 1234, "pid": 5}
    assert [p.name for p in tmp_path.iterdir()] == ["ready.json"]
