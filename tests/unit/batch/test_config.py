"""Flags and environment map onto BatchConfig in one function; every rule refuses to start by name."""

import pytest

from services.batch.config import SETTINGS, load_config
from services.common.settings.errors import ConfigError

REQUIRED = ["--planner", "127.0.0.1:50061", "--dispatch-url", "http://127.0.0.1:8000"]


def test_defaults_with_the_two_required_addresses_are_valid_and_every_flag_has_an_env_var():
    cfg = load_config(REQUIRED, {})
    assert cfg.http_listen == "127.0.0.1:8090" and cfg.registry_path == "batch.sqlite3" and cfg.pool_id == "default"
    assert all(s.env and s.env.startswith("BANDMASTER_BATCH_") for s in SETTINGS)


def test_flag_wins_over_env_and_env_over_default():
    cfg = load_config(
        [*REQUIRED, "--pool-id", "flag"],
        {"BANDMASTER_BATCH_POOL_ID": "env", "BANDMASTER_BATCH_DISPATCH_MAX_INFLIGHT": "3"},
    )
    assert cfg.pool_id == "flag" and cfg.dispatch_max_inflight == 3


@pytest.mark.parametrize(
    "argv, rule",
    [
        (["--dispatch-url", "http://127.0.0.1:8000"], "--planner"),
        (["--planner", "127.0.0.1:50061"], "--dispatch-url"),
        ([*REQUIRED, "--planner", "nope"], "host:port"),
        ([*REQUIRED, "--dispatch-url", "http://u:p@host:1"], "without credentials"),
        ([*REQUIRED, "--dispatch-url", "ftp://host:1"], "http(s) URL"),
        ([*REQUIRED, "--http-listen", "nope"], "host:port"),
        ([*REQUIRED, "--max-batch-requests", "0"], "1 <= max_batch_requests"),
        ([*REQUIRED, "--max-file-bytes", "10"], "1024 <= max_file_bytes"),
        ([*REQUIRED, "--report-interval-seconds", "0"], "report_interval_seconds > 0"),
        ([*REQUIRED, "--dispatch-max-attempts", "0"], "dispatch_max_attempts >= 1"),
        ([*REQUIRED, "--pool-id", "a b"], "pool_id must be"),
        ([*REQUIRED, "--file-retention-seconds", "3599"], "3600 <= file_retention_seconds"),
        ([*REQUIRED, "--cleanup-interval-seconds", "0"], "cleanup_interval_seconds > 0"),
        ([*REQUIRED, "--cleanup-max-files-per-pass", "0"], "cleanup_max_files_per_pass >= 1"),
    ],
)
def test_invalid_config_names_the_violated_rule(argv, rule):
    with pytest.raises(ConfigError, match=rule.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        load_config(argv, {})


def test_retention_and_cleanup_settings_reach_the_config_from_flags_and_env():
    cfg = load_config(
        [*REQUIRED, "--file-retention-seconds", "7200"], {"BANDMASTER_BATCH_CLEANUP_MAX_FILES_PER_PASS": "5"}
    )
    assert cfg.file_retention_seconds == 7200 and cfg.cleanup_max_files_per_pass == 5
    assert load_config(REQUIRED, {}).file_retention_seconds == 30 * 86400  # OpenAI's default for batch files
