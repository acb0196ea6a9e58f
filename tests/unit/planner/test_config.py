"""Flags and environment map onto PlannerConfig in one function; every rule refuses to start by name."""

import ast
import json
import pathlib

import pytest

from services.common.settings.errors import ConfigError
from services.planner.adapters.profile import load_engine_profile
from services.planner.config import SETTINGS, load_config
from services.planner.core.throughput import EngineProfile
from services.planner.server import build_settings


def test_defaults_are_valid_and_every_flag_has_an_env_var():
    cfg = load_config([], {})
    assert cfg.lease_store == "memory" and cfg.connector == "virtual" and not cfg.advisory
    assert all(s.env and s.env.startswith("BANDMASTER_PLANNER_") for s in SETTINGS)
    assert cfg.drain_lease_duration_seconds >= cfg.minimum_lease_seconds


def test_flag_wins_over_env_and_env_over_default():
    cfg = load_config(
        ["--pool-id", "flag"],
        {
            "BANDMASTER_PLANNER_POOL_ID": "env",
            "BANDMASTER_PLANNER_MAX_REPLICAS": "3",
            "BANDMASTER_PLANNER_ROUTER_METRICS_URL": "http://a:1,http://b:2",
        },
    )
    assert cfg.pool_id == "flag" and cfg.max_replicas == 3
    assert cfg.router_metrics_url == ("http://a:1", "http://b:2")


@pytest.mark.parametrize(
    "argv, rule",
    [
        (["--no-such-flag"], "unrecognized arguments"),
        (["--lease-store", "redis"], "--redis-url is required"),
        (["--lease-store", "redis", "--redis-url", "http://x:1"], "redis://"),
        (["--connector", "kubernetes"], "--k8s-deployment is required"),
        (["--connector", "ftp"], "must be one of"),
        (["--max-replicas", "0"], "max_replicas >= max(1, min_replicas)"),
        (["--min-replicas", "5", "--max-replicas", "4"], "max_replicas >= max(1, min_replicas)"),
        (["--scale-from-zero-replicas", "9", "--max-replicas", "8"], "scale_from_zero_replicas <= max_replicas"),
        (["--drain-lease-duration-seconds", "10"], "so a healthy planner renews before expiry"),
        (["--tick-interval-seconds", "0"], "tick_interval_seconds > 0"),
        (["--observe-timeout-seconds", "20"], "observe_timeout_seconds <= tick_max_duration_seconds"),
        (["--max-batch-admission-rps", "-2"], "max_batch_admission_rps >= 0"),
        (["--scale-down-utilization", "0.99"], "scale_down_utilization < scale_up_utilization"),
        (["--total-power-limit-watts", "1000"], "watts_per_replica > 0"),
        (["--safe-rps-fraction", "1.5"], "0 < safe_rps_fraction <= 1"),
    ],
)
def test_invalid_config_names_the_violated_rule(argv, rule):
    with pytest.raises(ConfigError, match=rule.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        load_config(argv, {})


@pytest.mark.parametrize(
    "flag",
    [
        ["--dispatch-url", "http://router:8000"],
        ["--http-listen", "127.0.0.1:8090"],
        ["--max-batch-requests", "10"],
        ["--subtract-dispatch-from-online"],
        ["--dispatch-max-inflight", "4"],
    ],
)
def test_the_planner_has_no_data_plane_flags(flag):
    """The Batch API and its dispatcher are the batch service's (python -m services.batch): the planner refuses
    their flags rather than ignoring them."""
    with pytest.raises(ConfigError, match="unrecognized arguments"):
        load_config(flag, {})


def test_redis_password_is_never_echoed():
    with pytest.raises(ConfigError) as info:
        load_config(["--lease-store", "redis", "--redis-url", "http://user:secret@h:1"], {})
    assert "secret" not in str(info.value)


def test_advisory_mode_relaxes_the_lease_minimum():
    assert load_config(["--advisory", "--drain-lease-duration-seconds", "5"], {}).advisory


def test_profiles_load_by_name_or_path(tmp_path):
    p = load_engine_profile("mocker-h100")
    assert p.decode_x == "kv_utilisation" and p.kv_capacity_tokens == 262144
    bad = tmp_path / "p.json"
    bad.write_text('{"decode_x": "context_k"}')
    with pytest.raises(ConfigError, match="missing fields"):
        load_engine_profile(str(bad))
    with pytest.raises(ConfigError, match="cannot read"):
        load_engine_profile("no-such-profile")


def test_the_core_builds_the_engine_profile_from_fields_handed_in():
    """The adapter reads the file; the core's EngineProfile.from_fields checks and converts the fields."""
    fields = {
        "name": "x",
        "decode_x": "context_k",
        **{f: 1 for f in ("decode_e0_ms", "decode_e1_ms", "decode_e2_ms", "decode_x_knee", "decode_min_ms")},
        **{f: 0 for f in ("prefill_step_base_ms", "prefill_ms_per_token", "prefill_attn_ms_per_token2")},
        "kv_capacity_tokens": 1000,
    }
    p = EngineProfile.from_fields(fields, "x.json", max_running_requests=8)
    assert (p.name, p.decode_e0_ms, p.kv_capacity_tokens, p.max_running_requests) == ("x", 1.0, 1000, 8)
    assert EngineProfile.from_fields(fields, "x.json", kv_capacity_tokens=50).kv_capacity_tokens == 50
    for broken, reason in (
        ({**fields, "decode_x": "batch"}, "decode_x must be"),
        ({**fields, "decode_e1_ms": "fast"}, "bad field value"),
        ({k: v for k, v in fields.items() if k != "decode_min_ms"}, "missing fields: decode_min_ms"),
    ):
        with pytest.raises(ConfigError, match=reason) as info:
            EngineProfile.from_fields(broken, "x.json")
        assert (info.value.field, info.value.value) == ("timing_profile", "x.json")


@pytest.mark.parametrize(
    "profile, worker_model",
    [
        ("glm45-fp8-h200", "zai-org/GLM-4.5-FP8"),
        ("mocker-h100", "meta-llama/Llama-3.1-8B-Instruct"),
        ("mocker-h100", ""),  # unset: nothing checked
    ],
)
def test_a_profile_for_the_served_model_is_accepted(profile, worker_model):
    cfg = load_config(["--timing-profile", profile, "--worker-model", worker_model], {})
    assert build_settings(cfg).batch.safe_rps_per_ready_replica > 0


@pytest.mark.parametrize(
    "profile, worker_model, reason",
    [
        ("glm45-fp8-h200", "Qwen/Qwen3-8B", "is for zai-org/GLM-4.5-FP8"),
        ("mocker-h100", "zai-org/GLM-4.5-FP8", "is for meta-llama/Llama-3.1-8B-Instruct"),
        ("unnamed", "Qwen/Qwen3-8B", "names no model"),
    ],
)
def test_the_planner_refuses_a_profile_for_another_model(tmp_path, profile, worker_model, reason):
    if profile == "unnamed":  # a user's file without a "model" field cannot be checked, so it is refused
        fields = json.loads(load_engine_profile_text("mocker-h100"))
        del fields["model"]
        profile = str(tmp_path / "unnamed.json")
        pathlib.Path(profile).write_text(json.dumps(fields))
    cfg = load_config(
        [], {"BANDMASTER_PLANNER_TIMING_PROFILE": profile, "BANDMASTER_PLANNER_WORKER_MODEL": worker_model}
    )
    with pytest.raises(ConfigError, match=reason) as info:
        build_settings(cfg)
    assert (info.value.field, info.value.value) == ("worker_model", worker_model)


def load_engine_profile_text(name: str) -> str:
    return (
        pathlib.Path(__file__).resolve().parents[3] / "services/simworker/core/profiles" / f"{name}.json"
    ).read_text()


CORE = pathlib.Path(__file__).resolve().parents[3] / "services" / "planner" / "core"
FORBIDDEN = {
    "grpc",
    "asyncio",
    "aiohttp",
    "socket",
    "time",
    "sqlite3",
    "redis",
    "kubernetes",
    "bandmaster",
    "services.simworker",
    "services.planner.adapters",
    "services.planner.loop",
    "requests",
    "subprocess",
}


@pytest.mark.parametrize("path", sorted(CORE.glob("*.py")), ids=lambda p: p.name)
def test_the_core_is_pure(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        for name in names:
            assert not any(name == f or name.startswith(f + ".") for f in FORBIDDEN), f"{path.name} imports {name}"
