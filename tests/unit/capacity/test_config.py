"""load_config: flag > env > default, and every invalid combination refuses to start naming the rule."""

import pytest

from services.capacity.config import CapacityConfig, load_config, validate_worker_url
from services.capacity.core.state import Expectation, Origin
from services.common.settings.errors import ConfigError


def test_defaults():
    cfg = load_config([], {})
    assert cfg == CapacityConfig()
    assert (cfg.listen, cfg.metrics_port, cfg.poll_interval_seconds) == ("127.0.0.1:50051", 9101, 5.0)
    assert (cfg.unhealthy_after_failures, cfg.remove_unhealthy_after_seconds) == (3, 300.0)
    assert cfg.cap_host_at_gpu is False
    assert (cfg.max_server_info_bytes, cfg.confirm_increase_polls, cfg.transition_log_interval_seconds) == (
        8 * 1024 * 1024,
        2,
        60.0,
    )


def test_reliability_settings_from_flags_and_env():
    cfg = load_config(
        ["--confirm-increase-polls", "3"],
        {
            "BANDMASTER_CAPACITY_MAX_SERVER_INFO_BYTES": "65536",
            "BANDMASTER_CAPACITY_CONFIRM_INCREASE_POLLS": "5",
            "BANDMASTER_CAPACITY_TRANSITION_LOG_INTERVAL_SECONDS": "0",
        },
    )
    assert (cfg.max_server_info_bytes, cfg.confirm_increase_polls, cfg.transition_log_interval_seconds) == (
        65536,
        3,
        0.0,
    )


def test_flags_and_env():
    cfg = load_config(
        [
            "--worker-url",
            "http://a:1/",
            "--worker-url",
            "https://b:2",
            "--poll-interval-seconds",
            "2",
            "--cap-host-at-gpu",
        ],
        {
            "BANDMASTER_CAPACITY_POLL_INTERVAL_SECONDS": "9",
            "BANDMASTER_CAPACITY_POLL_TIMEOUT_SECONDS": "0.5",
            "BANDMASTER_CAPACITY_LISTEN": "0.0.0.0:0",
            "BANDMASTER_CAPACITY_INSECURE": "true",  # the bind rule: a non-loopback address needs it
            "BANDMASTER_CAPACITY_REMOVE_UNHEALTHY_AFTER_SECONDS": "0",
        },
    )
    assert [(w.worker_id, w.url, w.origin) for w in cfg.workers] == [
        ("a:1", "http://a:1", Origin.FLAG),
        ("b:2", "https://b:2", Origin.FLAG),
    ]
    assert cfg.poll_interval_seconds == 2.0  # flag wins
    assert cfg.poll_timeout_seconds == 0.5
    assert cfg.listen == "0.0.0.0:0" and cfg.remove_unhealthy_after_seconds == 0 and cfg.security.insecure
    assert cfg.cap_host_at_gpu


def test_worker_urls_from_env():
    cfg = load_config([], {"BANDMASTER_CAPACITY_WORKER_URLS": "http://a:1, http://b:2"})
    assert [w.url for w in cfg.workers] == ["http://a:1", "http://b:2"]


def test_config_file(tmp_path):
    path = tmp_path / "workers.toml"
    path.write_text(
        '[[workers]]\nurl = "http://10.0.0.5:30000"\nid = "gpu-a"\nexpected_gpu_kv_tokens = 4096\n'
        '[[workers]]\nurl = "http://10.0.0.6:30000"\n'
    )
    cfg = load_config(["--worker-url", "http://x:1", "--config-file", str(path)], {})
    assert [(w.worker_id, w.origin) for w in cfg.workers] == [
        ("x:1", Origin.FLAG),
        ("gpu-a", Origin.CONFIG_FILE),
        ("10.0.0.6:30000", Origin.CONFIG_FILE),
    ]
    assert cfg.workers[1].expectation == Expectation(gpu_kv_tokens=4096)


@pytest.mark.parametrize(
    "argv, env, field, rule",
    [
        (["--poll-interval-seconds", "0"], {}, "poll_interval_seconds", "poll_interval_seconds > 0"),
        (["--poll-timeout-seconds", "0"], {}, "poll_timeout_seconds", "poll_timeout_seconds > 0"),
        (["--poll-timeout-seconds", "6"], {}, "poll_timeout_seconds", "poll_timeout_seconds <= poll_interval_seconds"),
        (
            [],
            {"BANDMASTER_CAPACITY_POLL_INTERVAL_SECONDS": "1"},
            "poll_timeout_seconds",
            "poll_timeout_seconds <= poll_interval_seconds",
        ),
        (["--unhealthy-after-failures", "0"], {}, "unhealthy_after_failures", "unhealthy_after_failures >= 1"),
        (
            ["--remove-unhealthy-after-seconds", "-1"],
            {},
            "remove_unhealthy_after_seconds",
            "remove_unhealthy_after_seconds >= 0",
        ),
        (["--watch-heartbeat-seconds", "0"], {}, "watch_heartbeat_seconds", "watch_heartbeat_seconds > 0"),
        (["--poll-interval-seconds", "nan"], {}, "poll_interval_seconds", "expected float"),
        ([], {"BANDMASTER_CAPACITY_UNHEALTHY_AFTER_FAILURES": "three"}, "unhealthy_after_failures", "expected int"),
        (["--listen", "nohost"], {}, "listen", "expected host:port"),
        (["--metrics-port", "70000"], {}, "metrics_port", "-1 <= metrics_port <= 65535"),
        (["--worker-url", "ftp://a:1"], {}, "worker_url", "scheme must be http or https"),
        (["--worker-url", "http://a"], {}, "worker_url", "explicit non-zero port"),
        (["--worker-url", "http://:80"], {}, "worker_url", "host is required"),
        (["--worker-url", "http://a:1?x=1"], {}, "worker_url", "no query"),
        (["--worker-url", "http://a:1", "--worker-url", "http://a:1/"], {}, "workers", "worker ids must be unique"),
        (["--bogus"], {}, "argv", "unrecognized arguments"),
        (
            ["--max-server-info-bytes", "1000"],
            {},
            "max_server_info_bytes",
            "1024 <= max_server_info_bytes <= 1073741824",
        ),
        (
            ["--max-server-info-bytes", str(2**31)],
            {},
            "max_server_info_bytes",
            "1024 <= max_server_info_bytes <= 1073741824",
        ),
        (
            [],
            {"BANDMASTER_CAPACITY_CONFIRM_INCREASE_POLLS": "0"},
            "confirm_increase_polls",
            "confirm_increase_polls >= 1 (1 = no damping)",
        ),
        (
            ["--transition-log-interval-seconds", "-1"],
            {},
            "transition_log_interval_seconds",
            "transition_log_interval_seconds >= 0 (0 = log every transition)",
        ),
    ],
)
def test_invalid_combinations_refuse_to_start(argv, env, field, rule):
    with pytest.raises(ConfigError) as info:
        load_config(argv, env)
    assert info.value.field == field
    assert rule in info.value.reason


@pytest.mark.parametrize(
    "text, field, rule",
    [
        ('[[workers]]\nurl = "http://a:1"\nweight = 2\n', "config_file.workers[0]", "unknown keys"),
        ("poll = 1\n", "config_file", "unknown top-level keys"),
        ('[[workers]]\nid = "x"\n', "config_file.workers[0].url", "url is required"),
        ('[[workers]]\nurl = "http://a:1"\nid = "has space"\n', "config_file.workers[0].id", "printable"),
        (
            '[[workers]]\nurl = "http://a:1"\nexpected_page_size = -1\n',
            "config_file.workers[0].expected_page_size",
            "integer >= 0",
        ),
        (
            '[[workers]]\nurl = "http://a:1"\nid="x"\n[[workers]]\nurl = "http://b:1"\nid="x"\n',
            "workers",
            "worker ids must be unique",
        ),
        (
            '[[workers]]\nurl = "http://a:1"\nid="x"\n[[workers]]\nurl = "http://a:1"\nid="y"\n',
            "workers",
            "worker urls must be unique",
        ),
        ("workers = 3\n", "config_file.workers", "array of tables"),
        ("[[workers\n", "config_file", "invalid TOML"),
    ],
)
def test_invalid_config_files(tmp_path, text, field, rule):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(["--config-file", str(path)], {})
    assert info.value.field == field and rule in info.value.reason


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(["--config-file", str(tmp_path / "nope.toml")], {})


@pytest.mark.parametrize(
    "url, canonical",
    [
        ("http://a:1", "http://a:1"),
        ("https://a.b:443/", "https://a.b:443"),
        ("http://[::1]:8000", "http://[::1]:8000"),
        ("http://h:1/prefix/", "http://h:1/prefix"),
    ],
)
def test_valid_urls(url, canonical):
    assert validate_worker_url(url) == canonical


@pytest.mark.parametrize("url", ["", "a:1", "http://a:0", "http://a:99999", "http://u:p@a:1", "http://a:1#f"])
def test_invalid_urls(url):
    with pytest.raises(ValueError):
        validate_worker_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "http://user:hunter2@a:1",
        "user:hunter2@a:1",
        "ftp://user:hunter2@a:1",
        "http://user:hunter2@a",
        "http://user:hunter2@a:1?x=1",
        "http://user:hunter2@a:x",
    ],
)
def test_credentials_in_urls_are_never_echoed(url, tmp_path):
    with pytest.raises(ValueError) as info:
        validate_worker_url(url)
    assert "hunter2" not in str(info.value) and "***@" in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_config(["--worker-url", url], {})
    assert "hunter2" not in str(info.value) and "hunter2" not in repr(info.value.value)
    path = tmp_path / "c.toml"
    path.write_text(f'[[workers]]\nurl = "{url}"\n')
    with pytest.raises(ConfigError) as info:
        load_config(["--config-file", str(path)], {})
    assert "hunter2" not in str(info.value) and "hunter2" not in repr(info.value.value)
