"""Pure pieces of the router shell: session headers, config mapping, KvRouter precedence, body validation,
final-request shapes, KV-event endpoints, error bodies."""

from __future__ import annotations

import pytest

from services.common.settings.errors import ConfigError
from services.router.adapters.kv_events import publisher_endpoint_from_info, subscribe_endpoint
from services.router.config import KvOverrides, load_config
from services.router.core.params import SchedulerKvSettings
from services.router.errors import BadRequest, ModelNotFound, NoHealthyWorker
from services.router.ingress.http_api import build_spec, empty_completion
from services.router.turn import session
from services.router.turn.turn_types import Api
from services.router.workers.fleet import resolve_params


@pytest.mark.parametrize(
    "headers, expected",
    [
        ({}, session.SessionIdentity()),
        ({"X-Dynamo-Session-ID": "  p1  "}, session.SessionIdentity("p1")),
        ({"X-Dynamo-Session-ID": "   "}, session.SessionIdentity()),
        ({"X-Dynamo-Session-ID": "p", "X-Dynamo-Parent-Session-ID": "p"}, session.SessionIdentity("p")),
        ({"X-Dynamo-Session-ID": "c", "X-Dynamo-Parent-Session-ID": "root"}, session.SessionIdentity("c", "root")),
        ({"X-Dynamo-Session-ID": "p", "X-Dynamo-Session-Final": "TRUE"}, session.SessionIdentity("p", "", True)),
        ({"X-Dynamo-Session-ID": "p", "X-Dynamo-Session-Final": ""}, session.SessionIdentity("p")),
        ({"X-Dynamo-Session-ID": "x" * 256}, session.SessionIdentity("x" * 256)),
    ],
)
def test_session_headers(headers, expected):
    assert session.from_headers(headers) == expected


@pytest.mark.parametrize(
    "headers",
    [
        {"X-Dynamo-Session-ID": "x" * 257},
        {"X-Dynamo-Session-ID": "a\tb"},
        {"X-Dynamo-Session-ID": "é"},
        {"X-Dynamo-Parent-Session-ID": "a\x7fb"},
        {"X-Dynamo-Session-Final": "perhaps"},
    ],
)
def test_invalid_session_headers(headers):
    with pytest.raises(BadRequest):
        session.from_headers(headers)


def test_config_flags_env_and_rules():
    c = load_config(
        ["--no-scheduler", "--router-temperature", "0.5", "--http-port", "0"],
        {"BANDMASTER_ROUTER_CAPACITY_ADDR": "10.0.0.1:7", "DYN_USE_KV_EVENTS": "false"},
    )
    assert not c.use_scheduler and c.capacity_addr == "10.0.0.1:7" and c.http_port == 0
    assert c.kv == KvOverrides(router_temperature=0.5, use_kv_events=False)
    assert load_config([], {}).use_scheduler and load_config([], {}).kv == KvOverrides()
    for argv, rule in [
        (["--block-size", "1"], "block_size > 1"),
        (["--max-body-bytes", "10"], "max_body_bytes >= 1024"),
        (["--scheduler-addr", "nohost"], "expected host:port"),
        (["--upstream-first-token-timeout-seconds", "0"], "upstream_first_token_timeout_seconds > 0"),
    ]:
        with pytest.raises(ConfigError, match=rule):
            load_config(argv, {})


def test_reliability_settings_defaults_env_and_flags():
    c = load_config([], {})
    assert (c.admit_decision_timeout_seconds, c.admit_hold_timeout_seconds, c.scheduler_retry_seconds) == (2, 3600, 1)
    assert (
        c.upstream_first_token_timeout_seconds,
        c.upstream_inter_token_timeout_seconds,
        c.upstream_response_timeout_seconds,
    ) == (60, 30, 600)
    assert (c.worker_failure_threshold, c.worker_eject_seconds, c.worker_eject_max_seconds) == (3, 5, 60)
    assert (
        c.http_header_timeout_seconds,
        c.http_body_timeout_seconds,
        c.http_keepalive_timeout_seconds,
        c.http_max_connections,
    ) == (10, 30, 60, 2048)
    assert not c.http_metrics and not c.http_server_version
    assert (
        c.client_max_programs,
        c.client_new_programs_per_second,
        c.client_new_programs_burst,
        c.client_program_idle_seconds,
    ) == (2048, 50, 200, 900)
    c = load_config(
        ["--admit-decision-timeout-seconds", "0.5", "--http-metrics", "--worker-failure-threshold", "0"],
        {
            "BANDMASTER_ROUTER_UPSTREAM_INTER_TOKEN_TIMEOUT_SECONDS": "7",
            "BANDMASTER_ROUTER_HTTP_SERVER_VERSION": "true",
            "BANDMASTER_ROUTER_CLIENT_MAX_PROGRAMS": "5",
            "BANDMASTER_ROUTER_ADMIT_DECISION_TIMEOUT_SECONDS": "9",
        },
    )
    assert c.admit_decision_timeout_seconds == 0.5 and c.http_metrics and c.worker_failure_threshold == 0
    assert c.upstream_inter_token_timeout_seconds == 7 and c.http_server_version and c.client_max_programs == 5
    assert c.worker_breaker.failure_threshold == 0 and c.client_limits.max_programs == 5
    assert c.scheduler_breaker.failure_threshold == 1 and c.scheduler_breaker.open_s == c.scheduler_retry_seconds


@pytest.mark.parametrize(
    "argv, rule",
    [
        (["--admit-decision-timeout-seconds", "0"], "admit_decision_timeout_seconds > 0"),
        (
            ["--admit-decision-timeout-seconds", "10", "--admit-hold-timeout-seconds", "5"],
            "admit_decision_timeout_seconds <= admit_hold_timeout_seconds",
        ),
        (["--scheduler-retry-seconds", "-1"], "scheduler_retry_seconds > 0"),
        (["--upstream-inter-token-timeout-seconds", "0"], "upstream_inter_token_timeout_seconds > 0"),
        (["--upstream-response-timeout-seconds", "0"], "upstream_response_timeout_seconds > 0"),
        (["--worker-failure-threshold", "-1"], "worker_failure_threshold >= 0"),
        (
            ["--worker-eject-seconds", "10", "--worker-eject-max-seconds", "5"],
            "worker_eject_max_seconds >= worker_eject_seconds",
        ),
        (["--http-header-timeout-seconds", "0"], "http_header_timeout_seconds > 0"),
        (["--http-body-timeout-seconds", "0"], "http_body_timeout_seconds > 0"),
        (["--http-keepalive-timeout-seconds", "0"], "http_keepalive_timeout_seconds > 0"),
        (["--http-max-connections", "0"], "http_max_connections >= 1"),
        (["--client-max-programs", "-1"], "client_max_programs >= 0"),
        (["--client-new-programs-per-second", "-1"], "client_new_programs_per_second >= 0"),
        (["--client-new-programs-burst", "0"], "client_new_programs_burst >= 1"),
        (["--client-program-idle-seconds", "0"], "client_program_idle_seconds > 0"),
        (["--admit-timeout-seconds", "5"], "unrecognized arguments"),
    ],
)
def test_reliability_settings_refuse_invalid_values_naming_the_rule(argv, rule):
    with pytest.raises(ConfigError, match=rule):
        load_config(argv, {})


def test_kv_params_precedence_flags_then_scheduler_then_defaults():
    sched = SchedulerKvSettings(
        router_temperature=0.3,
        kv_overlap_score_weight=2.0,
        use_kv_events=False,
        router_track_active_blocks=True,
        router_track_output_blocks=False,
        router_track_prefill_tokens=False,
        router_ttl_secs=30.0,
        router_block_size=128,
    )
    p = resolve_params(KvOverrides(router_temperature=0.0), sched, page_size=16)
    assert (p.router_temperature, p.kv_overlap_score_weight, p.use_kv_events, p.router_ttl_s, p.block_size) == (
        0.0,
        2.0,
        False,
        30.0,
        16,
    )
    assert (p.router_track_active_blocks, p.router_track_prefill_tokens) == (True, False)
    assert resolve_params(KvOverrides(), sched, None).block_size == 128
    assert resolve_params(KvOverrides(block_size=32), sched, 16).block_size == 32
    d = resolve_params(KvOverrides(), None, None)
    assert (d.use_kv_events, d.kv_overlap_score_weight, d.block_size) == (True, 1.0, 16)
    assert (d.router_track_active_blocks, d.router_track_prefill_tokens) == (True, True)


@pytest.mark.parametrize(
    "api, body",
    [
        (Api.CHAT, {"messages": {"role": "user"}}),
        (Api.CHAT, {"messages": [{"content": "no role"}]}),
        (Api.CHAT, {"messages": [{"role": "user", "content": 5}]}),
        (Api.CHAT, {"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}),
        (Api.CHAT, {"messages": [{"role": "user", "content": "x"}], "max_tokens": True}),
        (Api.CHAT, {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}),
        (Api.CHAT, {"messages": [{"role": "user", "content": "x"}], "stop": [1]}),
        (Api.CHAT, {"messages": [{"role": "user", "content": "x"}], "model": ""}),
        (Api.CHAT, {"messages": [{"role": "user", "content": "x"}], "stream_options": []}),
        (Api.COMPLETIONS, {"prompt": ""}),
        (Api.COMPLETIONS, {"prompt": [1, "a"]}),
        (Api.GENERATE, {"text": "a", "input_ids": [1]}),
        (Api.GENERATE, {}),
        (Api.GENERATE, {"input_ids": [-1]}),
        (Api.GENERATE, {"text": ["batch"]}),
        (Api.GENERATE, {"text": "a", "sampling_params": [{}]}),
    ],
)
def test_body_validation_rejects(api, body):
    with pytest.raises(BadRequest):
        build_spec(api, body, session.SessionIdentity())


def test_body_validation_accepts_and_describes_the_turn():
    spec = build_spec(Api.GENERATE, {"input_ids": [1, 2, 3], "stream": True}, session.SessionIdentity("p"))
    assert spec.prompt_token_ids == [1, 2, 3] and spec.stream and spec.identity.is_program
    spec = build_spec(Api.COMPLETIONS, {"prompt": ["text"], "model": "m"}, session.SessionIdentity())
    assert spec.prompt_text == "text" and spec.model == "m" and not spec.stream
    a = build_spec(Api.CHAT, {"messages": [{"role": "user", "content": "a"}]}, session.SessionIdentity())
    b = build_spec(
        Api.CHAT,
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
        session.SessionIdentity(),
    )
    assert b.prompt_text.startswith(a.prompt_text)  # history re-sent = same routing prefix


def test_final_request_shapes():
    chat = empty_completion(Api.CHAT, "m", True, True)
    assert chat[-1] == b"data: [DONE]\n\n" and b'"usage"' in chat[-2] and b'"finish_reason":"stop"' in chat[1]
    assert empty_completion(Api.COMPLETIONS, "m", True, False)[-1] == b"data: [DONE]\n\n"
    response = empty_completion(Api.CHAT, "m", False, False)
    assert response.status == 200 and b'"content":""' in response.body


def test_kv_event_endpoints():
    assert subscribe_endpoint("tcp://*:5557", "http://10.1.2.3:30000", 0) == "tcp://10.1.2.3:5557"
    assert subscribe_endpoint("tcp://0.0.0.0:5557", "http://h:1", 2) == "tcp://h:5559"
    assert subscribe_endpoint("tcp://pub.example:6000", "http://h:1", 1) == "tcp://pub.example:6001"
    assert subscribe_endpoint("ipc:///tmp/x", "http://h:1", 0) is None
    assert (
        publisher_endpoint_from_info({"kv_events_config": '{"publisher": "zmq", "endpoint": "tcp://*:9"}'})
        == "tcp://*:9"
    )
    assert publisher_endpoint_from_info({"kv_events_config": None}) is None
    assert publisher_endpoint_from_info({"kv_events_config": {"publisher": "null"}}) is None


def test_error_bodies_are_openai_shaped():
    for err, status in [(BadRequest("x", param="p"), 400), (ModelNotFound("m"), 404), (NoHealthyWorker("n"), 503)]:
        assert err.http_status == status
        assert set(err.body()["error"]) == {"message", "type", "param", "code"}
