"""The one KvRouter flag declaration (KvRouterFlags): the scheduler's settings and KvRouterConfig, and the router's
overrides, are built from it (same names, environment variables, help and rules; the router's defaults are None)."""

from __future__ import annotations

import dataclasses

import pytest

from services.common.settings import kv_router_flags
from services.common.settings.errors import ConfigError
from services.router import config as router_config
from services.scheduler import config as scheduler_config
from services.scheduler.core.defaults import KvRouterConfig


def test_scheduler_config_is_the_table_with_its_real_defaults():
    fields = {f.name: f.default for f in dataclasses.fields(KvRouterConfig)}
    assert fields == {f.name: f.default for f in kv_router_flags.KV_ROUTER_FLAGS}
    listed = [s for s in scheduler_config.SETTINGS if s.name in kv_router_flags.BY_NAME]
    assert listed == kv_router_flags.scheduler_settings()


def test_router_overrides_are_table_rows_defaulting_to_the_schedulers_value():
    router = {s.name: s for s in router_config.SETTINGS if s.name in kv_router_flags.BY_NAME}
    assert set(router) == set(router_config.KV_FROM_SCHEDULER) and router
    for name, setting in router.items():
        row = kv_router_flags.BY_NAME[name]
        assert (setting.type, setting.env, setting.default) == (row.type, row.env, None)
        assert setting.help == row.help + kv_router_flags.FROM_SCHEDULER
    overrides = {f.name for f in dataclasses.fields(router_config.KvOverrides)}
    assert overrides == {*router_config.KV_FROM_SCHEDULER, "block_size"}


@pytest.mark.parametrize(
    "name, value, reason",
    [
        ("router_temperature", -0.1, "router_temperature >= 0"),
        ("router_ttl_secs", 0.0, "router_ttl_secs > 0"),
        ("router_block_size", 0, "router_block_size > 0"),
    ],
)
def test_a_value_off_its_rule_is_one_config_error_naming_it(name, value, reason):
    with pytest.raises(ConfigError) as caught:
        kv_router_flags.validate({name: value})
    assert (caught.value.field, caught.value.value, caught.value.reason) == (name, value, reason)
    with pytest.raises(ConfigError, match=reason):
        KvRouterConfig(**{name: value})


def test_not_given_passes():
    kv_router_flags.validate({name: None for name in kv_router_flags.BY_NAME})


# A value off the default for every flag, and the KvRouterParams field the router's selection core reads it as.
NON_DEFAULT = {
    "router_temperature": ("0.5", "router_temperature", 0.5),
    "kv_overlap_score_weight": ("2.5", "kv_overlap_score_weight", 2.5),
    "use_kv_events": (False, "use_kv_events", False),
    "router_track_active_blocks": (False, "router_track_active_blocks", False),
    "router_track_output_blocks": (True, "router_track_output_blocks", True),
    "router_track_prefill_tokens": (False, "router_track_prefill_tokens", False),
    "router_ttl_secs": ("30", "router_ttl_s", 30.0),
    "router_block_size": ("64", "block_size", 64),
}


def _argv(name, value):
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return [flag if value else "--no-" + flag[2:]]
    return [flag, value]


def test_every_flag_has_an_effect_case():
    assert set(NON_DEFAULT) == set(kv_router_flags.BY_NAME)


@pytest.mark.parametrize("name", sorted(NON_DEFAULT))
def test_every_flag_reaches_the_routers_selection_params(name):
    """Given to the scheduler, the flag travels through GetRouterConfig into the KvRouterParams the router's
    core is built with (fleet.resolve_params), and changes exactly its own field there."""
    from services.router.adapters.scheduler import kv_settings_from_proto
    from services.router.config import KvOverrides
    from services.router.workers.fleet import resolve_params
    from services.scheduler.adapters.proto import router_config_to_proto

    def router_params(argv):
        kv = scheduler_config.load_config(argv, {}).kv_router
        return resolve_params(KvOverrides(), kv_settings_from_proto(router_config_to_proto(kv)), None)

    raw, field, expected = NON_DEFAULT[name]
    baseline, changed = router_params([]), router_params(_argv(name, raw))
    assert getattr(changed, field) == expected != getattr(baseline, field)
    assert dataclasses.replace(changed, **{field: getattr(baseline, field)}) == baseline


@pytest.mark.parametrize("name", sorted(kv_router_flags.UNSUPPORTED))
@pytest.mark.parametrize("load_config", [scheduler_config.load_config, router_config.load_config])
def test_an_unsupported_dynamo_flag_is_refused_by_name(name, load_config):
    flag = "--" + name.replace("_", "-")
    for argv in ([flag], ["--no-" + flag[2:]], [flag + "=1"], [flag, "1"]):
        with pytest.raises(ConfigError) as caught:
            load_config(argv, {})
        assert caught.value.field == name
        assert f"{flag} is a Dynamo KvRouter flag not supported by Bandmaster" in caught.value.reason
    variable = "DYN_" + name.upper()
    with pytest.raises(ConfigError, match=f"{variable} is a Dynamo KvRouter setting not supported by Bandmaster"):
        load_config([], {variable: "1"})
    assert name not in kv_router_flags.BY_NAME


def test_an_unknown_flag_is_still_refused_as_unrecognized():
    with pytest.raises(ConfigError, match="unrecognized arguments: --router-made-up"):
        scheduler_config.load_config(["--router-made-up"], {})
