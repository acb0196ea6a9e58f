"""load_config: every flag/env/default of the seed reference, and every relation refused by name."""

from __future__ import annotations

import pytest

from services.common.settings.errors import ConfigError
from services.scheduler.config import SchedulerConfig, load_config
from services.scheduler.core import ControlParams

DEFAULTS = {
    "pause_threshold": 0.95,
    "soft_demote_threshold": 0.80,
    "pause_target": 0.80,
    "resume_hysteresis": 0.10,
    "resume_priority_boost": 1.0,
    "resume_timeout_seconds": 1800.0,
    "scheduler_interval_seconds": 5.0,
    "soft_demote_priority_jump": -2.0,
    "acting_token_weight": 1.0,
    "acting_decay_tau_seconds": 1.0,
    "program_idle_ttl_seconds": 900.0,
}


PROGRAM_AWARE_BANDS = {
    "pause_threshold": 1.0,
    "soft_demote_threshold": 0.95,
    "pause_target": 0.95,
    "resume_hysteresis": 0.03,
    "tail_protection_quantile": 0.75,
    "pause_margin_quantile": 1.0,
}


def test_reference_defaults_under_threshold_policy():
    """The reference control law is unchanged behind --pause-policy threshold (flag or env)."""
    for cfg in (
        load_config(["--pause-policy", "threshold"], {}),
        load_config([], {"BANDMASTER_SCHEDULER_PAUSE_POLICY": "threshold"}),
    ):
        for name, value in DEFAULTS.items():
            assert getattr(cfg.control, name) == value, name
        assert cfg.control.tail_protection_quantile == 0.0
        assert cfg.control.pause_margin_quantile == 0.0


def test_program_aware_defaults_under_other_policies():
    cfg = load_config([], {})
    for name, value in {**DEFAULTS, **PROGRAM_AWARE_BANDS}.items():
        assert getattr(cfg.control, name) == value, name


@pytest.mark.parametrize("policy", ["threshold", "cost_aware"])
def test_explicit_band_flags_win_over_policy_defaults(policy):
    cfg = load_config(
        ["--pause-policy", policy, "--pause-threshold", "0.9", "--pause-target", "0.7"],
        {"DYN_THUNDERAGENT_RESUME_HYSTERESIS": "0.2", "BANDMASTER_SCHEDULER_TAIL_PROTECTION_QUANTILE": "0.5"},
    )
    assert (
        cfg.control.pause_threshold,
        cfg.control.pause_target,
        cfg.control.resume_hysteresis,
        cfg.control.tail_protection_quantile,
    ) == (0.9, 0.7, 0.2, 0.5)


def test_program_aware_bands_follow_an_explicit_pause_threshold():
    cfg = load_config(["--pause-threshold", "0.9"], {})
    assert (cfg.control.pause_target, cfg.control.soft_demote_threshold) == pytest.approx((0.85, 0.85))
    assert cfg.control.resume_hysteresis == 0.03


def test_tail_protection_quantile_is_validated():
    with pytest.raises(ConfigError, match="tail_protection_quantile"):
        load_config(["--tail-protection-quantile", "1.0"], {})


def test_defaults():
    cfg = load_config([], {})
    assert (cfg.pause_policy, cfg.capacity_addr, cfg.listen, cfg.metrics_port) == (
        "cost_aware",
        "127.0.0.1:50051",
        "127.0.0.1:50052",
        9102,
    )
    assert cfg.kv_router.use_kv_events is True and cfg.kv_router.router_temperature == 0.0


@pytest.mark.parametrize(
    "flag, env, field, value",
    [
        ("--pause-threshold", "DYN_THUNDERAGENT_PAUSE_THRESHOLD", "pause_threshold", 0.9),
        ("--soft-demote-threshold", "DYN_THUNDERAGENT_SOFT_DEMOTE_THRESHOLD", "soft_demote_threshold", 0.7),
        ("--pause-target", "DYN_THUNDERAGENT_PAUSE_TARGET", "pause_target", 0.6),
        ("--resume-hysteresis", "DYN_THUNDERAGENT_RESUME_HYSTERESIS", "resume_hysteresis", 0.2),
        ("--resume-priority-boost", "DYN_THUNDERAGENT_RESUME_PRIORITY_BOOST", "resume_priority_boost", 3.0),
        ("--resume-timeout-seconds", "DYN_THUNDERAGENT_RESUME_TIMEOUT_SECONDS", "resume_timeout_seconds", 60.0),
        (
            "--scheduler-interval-seconds",
            "DYN_THUNDERAGENT_SCHEDULER_INTERVAL_SECONDS",
            "scheduler_interval_seconds",
            2.0,
        ),
        (
            "--soft-demote-priority-jump",
            "DYN_THUNDERAGENT_SOFT_DEMOTE_PRIORITY_JUMP",
            "soft_demote_priority_jump",
            -5.0,
        ),
        ("--acting-token-weight", "DYN_THUNDERAGENT_ACTING_TOKEN_WEIGHT", "acting_token_weight", 0.5),
        ("--acting-decay-tau-seconds", "DYN_THUNDERAGENT_ACTING_DECAY_TAU_SECONDS", "acting_decay_tau_seconds", 4.0),
        ("--program-idle-ttl-seconds", "DYN_THUNDERAGENT_PROGRAM_IDLE_TTL_SECONDS", "program_idle_ttl_seconds", 0.0),
        ("--pause-margin-quantile", "BANDMASTER_SCHEDULER_PAUSE_MARGIN_QUANTILE", "pause_margin_quantile", 0.5),
    ],
)
def test_flag_and_env_names(flag, env, field, value):
    assert getattr(load_config([flag, str(value)], {}).control, field) == value
    assert getattr(load_config([], {env: str(value)}).control, field) == value
    # The flag wins over the environment.
    other = str(value / 2 if value else 1.0)
    assert getattr(load_config([flag, str(value)], {env: other}).control, field) == value


@pytest.mark.parametrize(
    "argv, reason",
    [
        (["--pause-threshold", "1.5"], "0 <= pause_threshold <= 1"),
        (
            [
                "--pause-threshold",
                "-0.1",
                "--pause-target",
                "0",
                "--resume-hysteresis",
                "0",
                "--soft-demote-threshold",
                "0",
            ],
            "0 <= pause_threshold <= 1",
        ),
        (["--pause-target", "0.97"], "0 <= pause_target <= pause_threshold"),
        (["--pause-margin-quantile", "1.5"], "0 <= pause_margin_quantile <= 1"),
        (["--pause-margin-quantile", "-0.5"], "0 <= pause_margin_quantile <= 1"),
        (["--pause-target", "-0.1"], "0 <= pause_target <= pause_threshold"),
        (["--resume-hysteresis", "0.96"], "0 <= resume_hysteresis <= pause_threshold"),
        (["--resume-hysteresis", "-0.01"], "0 <= resume_hysteresis <= pause_threshold"),
        (["--soft-demote-threshold", "0.99"], "0 <= soft_demote_threshold <= pause_threshold"),
        (["--soft-demote-threshold", "-1"], "0 <= soft_demote_threshold <= pause_threshold"),
        (["--acting-token-weight", "0"], "acting_token_weight > 0"),
        (["--scheduler-interval-seconds", "0"], "scheduler_interval_seconds > 0"),
        (["--resume-timeout-seconds", "-1"], "resume_timeout_seconds > 0"),
        (["--program-idle-ttl-seconds", "-1"], "program_idle_ttl_seconds >= 0"),
        (["--acting-decay-tau-seconds", "0"], "acting_decay_tau_seconds >= 0.001"),
        (["--router-temperature", "-1"], "router_temperature >= 0"),
        (["--kv-overlap-score-weight", "-1"], "kv_overlap_score_weight >= 0"),
        (
            ["--router-track-output-blocks", "--no-router-track-active-blocks"],
            "router_track_output_blocks requires router_track_active_blocks",
        ),
        (["--router-ttl-secs", "0"], "router_ttl_secs > 0"),
        (["--router-block-size", "0"], "router_block_size > 0"),
        (["--capacity-addr", "nohost"], "expected host:port"),
    ],
)
def test_every_relation_is_refused_by_name(argv, reason):
    argv = ["--pause-policy", "threshold", *argv]  # the reference's bands, which these cases cross
    with pytest.raises(ConfigError) as info:
        load_config(argv, {})
    assert info.value.reason == reason
    assert info.value.field in reason or info.value.field == "capacity_addr"


@pytest.mark.parametrize(
    "argv, env",
    [
        (["--pause-threshold", "abc"], {}),
        ([], {"DYN_THUNDERAGENT_PAUSE_TARGET": "nan"}),
        (["--pause-policy", "nope"], {}),
        (["--no-such-flag"], {}),
    ],
)
def test_malformed_values_are_config_errors(argv, env):
    with pytest.raises(ConfigError):
        load_config(argv, env)


def test_kv_router_flags_are_forwarded():
    cfg = load_config(
        [
            "--router-temperature",
            "0.5",
            "--no-use-kv-events",
            "--router-track-output-blocks",
            "--no-router-track-prefill-tokens",
        ],
        {"DYN_ROUTER_BLOCK_SIZE": "64"},
    )
    kv = cfg.kv_router.as_dict()
    assert (
        kv["router_temperature"],
        kv["use_kv_events"],
        kv["router_track_output_blocks"],
        kv["router_track_prefill_tokens"],
        kv["router_block_size"],
    ) == (0.5, False, True, False, 64)
    assert load_config(["--use-kv-events"], {"DYN_USE_KV_EVENTS": "false"}).kv_router.use_kv_events is True


def test_config_is_frozen_and_validated_on_construction():
    cfg = SchedulerConfig()
    with pytest.raises(AttributeError):
        cfg.pause_policy = "x"  # type: ignore[misc]
    with pytest.raises(ConfigError):
        SchedulerConfig(pause_policy="nope")
    with pytest.raises(ConfigError):
        ControlParams(pause_threshold=0.5)  # default target 0.8 > 0.5


def test_ticket_lease_flag_env_and_bounds():
    assert load_config([], {}).ticket_lease_seconds == 30.0
    assert load_config(["--ticket-lease-seconds", "12"], {}).ticket_lease_seconds == 12.0
    assert load_config([], {"BANDMASTER_SCHEDULER_TICKET_LEASE_SECONDS": "0"}).ticket_lease_seconds == 0.0
    for bad in ("-1", "inf"):
        with pytest.raises(ConfigError) as info:
            load_config(["--ticket-lease-seconds", bad], {})
        assert info.value.field == "ticket_lease_seconds"


def test_state_store_defaults_and_choices():
    from services.scheduler.config import default_state_path

    assert default_state_path({"XDG_STATE_HOME": "/x"}) == "/x/bandmaster/scheduler.sqlite"
    assert default_state_path({"HOME": "/home/u"}) == "/home/u/.local/state/bandmaster/scheduler.sqlite"
    assert default_state_path({}) == "bandmaster-state/scheduler.sqlite"
    cfg = load_config([], {"HOME": "/home/u"})
    assert cfg.state_store == "sqlite" and cfg.state_path == "/home/u/.local/state/bandmaster/scheduler.sqlite"
    assert (cfg.state_flush_seconds, cfg.state_write_timeout_seconds, cfg.state_load_timeout_seconds) == (
        1.0,
        2.0,
        30.0,
    )
    assert load_config(["--state-path", "/s.db"], {}).state_path == "/s.db"
    assert load_config([], {"BANDMASTER_SCHEDULER_STATE_PATH": "/e.db"}).state_path == "/e.db"
    for memory in ("", "none", "NONE"):
        assert load_config(["--state-path", memory], {}).state_store == "memory"
    redis_cfg = load_config(["--state-redis-url", "redis://h:6379/1"], {})
    assert redis_cfg.state_store == "redis" and redis_cfg.state_redis_prefix == "bandmaster:scheduler:"
    assert SchedulerConfig().state_store == "memory"  # the dataclass (tests, embedding) keeps nothing


@pytest.mark.parametrize(
    "argv, field",
    [
        (["--state-redis-url", "http://user:secret@h:1"], "state_redis_url"),
        (["--state-flush-seconds", "0"], "state_flush_seconds"),
        (["--state-write-timeout-seconds", "-1"], "state_write_timeout_seconds"),
        (["--state-load-timeout-seconds", "inf"], "state_load_timeout_seconds"),
        (["--state-redis-prefix", "has space"], "state_redis_prefix"),
    ],
)
def test_state_settings_are_validated(argv, field):
    with pytest.raises(ConfigError) as info:
        load_config(argv, {})
    assert info.value.field == field
    assert "secret" not in str(info.value)
