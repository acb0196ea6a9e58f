"""Each setting is declared once: a `setting()` field of its service's config dataclass.

The flag/environment `Setting` list is derived from those fields (plus the composed sub-configs'
own lists), so a field and its flag cannot drift apart; `check_bounds` enforces the declared rules.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import pytest

from services.batch import config as batch_config
from services.capacity import config as capacity_config
from services.capacity import registrar
from services.common.settings.config import check_bounds, parse_settings, setting, settings_of
from services.common.settings.errors import ConfigError
from services.planner import config as planner_config
from services.router import config as router_config
from services.scheduler import config as scheduler_config
from services.simworker import config as simworker_config

# service config module -> (its config class, its fields that are derived or composed, not settings)
SERVICES: dict[str, tuple[Any, set[str]]] = {
    "batch": (batch_config.BatchConfig, {"tracing", "security"}),
    "capacity": (capacity_config.CapacityConfig, {"workers", "tracing", "security", "worker_client"}),
    "registrar": (registrar.RegistrarConfig, {"security", "worker_client"}),
    "planner": (planner_config.PlannerConfig, {"tracing", "security"}),
    "router": (router_config.RouterConfig, {"kv", "tracing", "security", "worker_client"}),
    "scheduler": (
        scheduler_config.SchedulerConfig,
        {"control", "lease", "cost_aware", "kv_router", "tracing", "security"},
    ),
    "simworker": (simworker_config.SimWorkerConfig, {"timing_overrides", "kv_events", "tracing"}),
}
MODULES = {
    "batch": batch_config,
    "capacity": capacity_config,
    "planner": planner_config,
    "registrar": registrar,
    "router": router_config,
    "scheduler": scheduler_config,
    "simworker": simworker_config,
}


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_every_field_is_a_setting_or_a_composed_config(service: str) -> None:
    cls, composed = SERVICES[service]
    settings = MODULES[service].SETTINGS
    names = [s.name for s in settings]
    assert len(names) == len(set(names)), "a setting is declared twice"
    field_names = {f.name for f in dataclasses.fields(cls)}
    # every field that is not a composed/derived one is a setting, with the same default
    assert field_names - composed <= set(names)
    by_name = {s.name: s for s in settings}
    for f in dataclasses.fields(cls):
        if f.name not in composed:
            assert by_name[f.name].default == f.default, f.name


def test_the_schedulers_flag_groups_name_their_core_parameters() -> None:
    """Each flags dataclass declares exactly the fields of the core parameter set it builds."""
    from services.common.settings.kv_router_flags import KvRouterFlags
    from services.scheduler.core.defaults import KvRouterConfig
    from services.scheduler.core.params import ControlParams
    from services.scheduler.core.policies import CostAwarePauseParams

    def names(cls: Any) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    assert names(scheduler_config.ControlFlags) <= names(ControlParams)
    assert {n.removeprefix("cost_aware_") for n in names(scheduler_config.CostAwareFlags)} <= names(
        CostAwarePauseParams
    )
    assert set(scheduler_config._LEASE) == names(scheduler_config.LeaseFlags)
    assert names(KvRouterFlags) == names(KvRouterConfig)


def test_the_routers_kv_overrides_are_its_flags_in_place() -> None:
    names = [s.name for s in router_config.SETTINGS]
    kv = [f.name for f in dataclasses.fields(router_config.KvOverrides)]
    start = names.index(kv[0])
    assert names[start : start + len(kv)] == kv


@dataclass(frozen=True)
class _Example:
    size: int = setting(4, "size", env="X_SIZE", ge=1, le=8)
    ratio: float | None = setting(None, "ratio", gt=0, lt=1)
    keep_seconds: float = setting(0.0, "keep", ge=0, note="(0 = never)")
    mode: str = setting("a", "mode", choices=("a", "b"))
    urls: tuple[str, ...] = setting((), "urls", env="X_URLS", repeated=True)
    on: bool = setting(True, "on", flag="--switch")
    derived: int = 0

    def __post_init__(self) -> None:
        check_bounds(self)


def test_settings_of_derives_type_flag_env_and_default_from_the_field() -> None:
    settings = {s.name: s for s in settings_of(_Example)}
    assert set(settings) == {"size", "ratio", "keep_seconds", "mode", "urls", "on"}
    assert (settings["size"].type, settings["size"].default, settings["size"].env) == (int, 4, "X_SIZE")
    assert settings["ratio"].type is float and settings["ratio"].default is None
    assert settings["urls"].type is str and settings["urls"].repeated
    assert settings["on"].flag_name == "--switch" and settings["on"].type is bool
    assert settings["mode"].choices == ("a", "b")
    values = parse_settings(settings_of(_Example), ["--size", "8", "--no-switch"], {"X_URLS": "u1, u2"}, prog="x")
    assert _Example(**values) == _Example(size=8, on=False, urls=("u1", "u2"))


@pytest.mark.parametrize(
    "kwargs, field, rule",
    [
        ({"size": 0}, "size", "1 <= size <= 8"),
        ({"size": 9}, "size", "1 <= size <= 8"),
        ({"ratio": 1.0}, "ratio", "0 < ratio < 1"),
        ({"ratio": float("nan")}, "ratio", "0 < ratio < 1"),
        ({"keep_seconds": -1.0}, "keep_seconds", "keep_seconds >= 0 (0 = never)"),
        ({"mode": "c"}, "mode", "mode must be one of a, b"),
    ],
)
def test_check_bounds_names_the_setting_and_the_rule(kwargs: dict[str, Any], field: str, rule: str) -> None:
    with pytest.raises(ConfigError) as err:
        _Example(**kwargs)
    assert err.value.field == field
    assert err.value.reason == rule


def test_check_bounds_passes_the_edges_and_none() -> None:
    _Example(size=1, ratio=None, keep_seconds=0.0)
    _Example(size=8, ratio=0.5, mode="b")
