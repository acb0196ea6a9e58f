from dataclasses import dataclass

import pytest

from services.common.settings.config import (
    TRUE_OR_FALSE,
    Setting,
    group,
    load_service_config,
    parse_bool,
    parse_host_port,
    parse_settings,
    pop_group,
    require,
    setting,
    settings_of,
)
from services.common.settings.errors import ConfigError

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


# -- groups shared by services: declared once with a {prefix}, composed by group(..., prefix=, load=) --


@dataclass(frozen=True)
class _SharedFlags:
    shared_limit: float = setting(1.0, "a shared bound", env="{prefix}_SHARED_LIMIT", gt=0)
    shared_name: str = setting("", "a shared name", env="{prefix}_SHARED_NAME")


def _load_shared(values, env):
    raw = pop_group(values, _SharedFlags)
    return (raw["shared_limit"], raw["shared_name"] or env.get("SHARED_FALLBACK", ""))


@dataclass(frozen=True)
class _Service:
    own: int = setting(2, "the service's own", env="SVC_OWN", ge=0)
    shared: tuple = group((1.0, ""), flags=_SharedFlags, prefix="SVC", load=_load_shared)


def test_a_group_lists_its_flags_in_its_place_with_the_service_prefix():
    settings = settings_of(_Service)
    assert [(s.name, s.env) for s in settings] == [
        ("own", "SVC_OWN"),
        ("shared_limit", "SVC_SHARED_LIMIT"),
        ("shared_name", "SVC_SHARED_NAME"),
    ]
    assert [s.env for s in settings_of(_SharedFlags, prefix="OTHER")] == ["OTHER_SHARED_LIMIT", "OTHER_SHARED_NAME"]


def test_a_prefixed_env_without_a_prefix_is_a_programming_error():
    with pytest.raises(TypeError, match="needs a prefix"):
        settings_of(_SharedFlags)


def test_load_service_config_parses_loads_the_groups_and_constructs():
    def load(argv=(), env=None):
        return load_service_config(_Service, list(argv), env or {}, prog="x", description="x")

    assert load() == _Service()
    assert load(["--own", "5", "--shared-limit", "2.5"], {"SVC_SHARED_NAME": "n"}) == _Service(5, (2.5, "n"))
    assert load([], {"SHARED_FALLBACK": "f"}).shared == (1.0, "f")  # the loader sees the environment


def test_a_group_bound_is_one_config_error_naming_the_rule():
    with pytest.raises(ConfigError) as err:
        load_service_config(_Service, ["--shared-limit", "0"], {}, prog="x", description="x")
    assert (err.value.field, err.value.value, err.value.reason) == ("shared_limit", 0.0, "shared_limit > 0")
