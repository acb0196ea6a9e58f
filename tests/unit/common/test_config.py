import pytest

from services.common.config import TRUE_OR_FALSE, Setting, parse_bool, parse_host_port, parse_settings, require
from services.common.errors import ConfigError

SETTINGS = [
    Setting("threshold", float, 0.95, "a fraction", env="X_THRESHOLD"),
    Setting("interval_seconds", float, 5.0, "tick", env="X_INTERVAL"),
    Setting("count", int, 3, "n", env="X_COUNT"),
    Setting("enabled", bool, False, "switch", env="X_ENABLED"),
    Setting("url", str, (), "repeatable", env="X_URLS", repeated=True),
    Setting("mode", str, "a", "choice", env="X_MODE", choices=("a", "b")),
]


def parse(argv=(), env=None):
    return parse_settings(SETTINGS, list(argv), env or {}, prog="x")


def test_defaults():
    assert parse() == {"threshold": 0.95, "interval_seconds": 5.0, "count": 3, "enabled": False, "url": (), "mode": "a"}


@pytest.mark.parametrize(
    "argv, env, name, expected",
    [
        (["--threshold", "0.5"], {}, "threshold", 0.5),
        ([], {"X_THRESHOLD": "0.7"}, "threshold", 0.7),
        (["--threshold", "0.5"], {"X_THRESHOLD": "0.7"}, "threshold", 0.5),  # flag wins
        ([], {"X_THRESHOLD": "  "}, "threshold", 0.95),  # blank env = unset
        (["--enabled"], {}, "enabled", True),
        (["--no-enabled"], {"X_ENABLED": "true"}, "enabled", False),
        ([], {"X_ENABLED": "yes"}, "enabled", True),
        (["--url", "a", "--url", "b"], {}, "url", ("a", "b")),
        ([], {"X_URLS": "a, b,"}, "url", ("a", "b")),
        (["--mode", "b"], {}, "mode", "b"),
    ],
)
def test_sources(argv, env, name, expected):
    assert parse(argv, env)[name] == expected


@pytest.mark.parametrize(
    "argv, env, field",
    [
        (["--threshold", "abc"], {}, "threshold"),
        (["--threshold", "nan"], {}, "threshold"),
        ([], {"X_THRESHOLD": "inf"}, "threshold"),
        (["--count", "1.5"], {}, "count"),
        ([], {"X_ENABLED": "maybe"}, "enabled"),
        (["--mode", "c"], {}, "mode"),
        (["--unknown", "1"], {}, "argv"),
    ],
)
def test_malformed_values_name_the_setting(argv, env, field):
    with pytest.raises(ConfigError) as info:
        parse(argv, env)
    assert info.value.field == field
    assert field in str(info.value)


def test_require_names_relation():
    with pytest.raises(ConfigError, match="0 <= a <= 1"):
        require(False, "a", 2, "0 <= a <= 1")


@pytest.mark.parametrize("text, expected", [("127.0.0.1:0", ("127.0.0.1", 0)), ("[::1]:80", ("::1", 80))])
def test_host_port(text, expected):
    assert parse_host_port(text, "listen") == expected


@pytest.mark.parametrize("text", ["nohost", ":80", "h:x", "h:70000"])
def test_host_port_rejects(text):
    with pytest.raises(ConfigError):
        parse_host_port(text, "listen")


@pytest.mark.parametrize(
    "text, value", [("1", True), (" TRUE ", True), ("yes", True), ("On", True), ("0", False), ("off", False)]
)
def test_parse_bool_takes_the_flag_words_in_any_case(text, value):
    assert parse_bool(text) is value


def test_parse_bool_refuses_other_words_naming_the_vocabulary():
    with pytest.raises(ValueError, match=r"expected one of \['0', '1', 'false', 'no', 'off', 'on', 'true', 'yes'\]"):
        parse_bool("maybe")
    assert parse_bool(" False", TRUE_OR_FALSE) is False
    for strict_refused in ("1", "yes", "on"):
        with pytest.raises(ValueError, match=r"\['false', 'true'\]"):
            parse_bool(strict_refused, TRUE_OR_FALSE)
