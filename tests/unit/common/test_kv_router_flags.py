"""The one KvRouter flag table: the scheduler's settings and KvRouterConfig, and the router's overrides, are built
from it (same names, environment variables, help and rules; the router's defaults are None)."""

from __future__ import annotations

import dataclasses

import pytest

from services.common import kv_router_flags
from services.common.errors import ConfigError
from services.router import config as router_config
from services.scheduler import config as scheduler_config
from services.scheduler.core.defaults import KvRouterConfig


def test_scheduler_config_is_the_table_with_its_real_defaults():
    fields = {f.name: f.default for f in dataclasses.fields(KvRouterConfig)}
    assert fields == {f.name: f.default for f in kv_router_flags.KV_ROUTER_FLAGS}
    assert scheduler_config.KV_ROUTER_SETTINGS == kv_router_flags.scheduler_settings()


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
        ("router_event_threads", 0, "router_event_threads >= 1"),
        ("router_queue_policy", "lifo", "router_queue_policy in {fcfs, lcfs, wspt}"),
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
