import pytest

from services.common.settings.errors import ConfigError
from services.router.core.cost import COST_POLICIES
from services.router.core.params import COST_POLICY_NAMES, KvRouterParams, RouterOverride


def test_defaults_follow_the_reference():
    p = KvRouterParams()
    assert p.router_temperature == 0.0
    assert p.kv_overlap_score_weight == 1.0
    assert p.use_kv_events is True
    assert p.router_track_output_blocks is False
    assert p.router_track_active_blocks is True and p.router_track_prefill_tokens is True
    assert p.router_ttl_s == 120.0
    assert p.prune_target_ratio == 0.8
    assert p.request_expiry_s == 300.0
    assert p.cost_policy == "classic"


@pytest.mark.parametrize(
    "field, value, rule",
    [
        ("router_temperature", -0.1, "router_temperature >= 0"),
        ("router_temperature", float("inf"), "router_temperature >= 0"),
        ("kv_overlap_score_weight", -1.0, "kv_overlap_score_weight >= 0"),
        ("kv_overlap_score_weight", float("nan"), "kv_overlap_score_weight >= 0"),
        ("block_size", 1, "block_size > 1"),
        ("block_size", 0, "block_size > 1"),
        ("router_ttl_s", 0.0, "router_ttl_s > 0"),
        ("max_blocks_per_worker", 0, "max_blocks_per_worker >= 1"),
        ("prune_target_ratio", 0.0, "0 < prune_target_ratio <= 1"),
        ("prune_target_ratio", 1.5, "0 < prune_target_ratio <= 1"),
        ("text_chunk_chars", 0, "text_chunk_chars >= 1"),
        ("request_expiry_s", -5.0, "request_expiry_s > 0"),
        ("cost_policy", "fastest", "cost_policy in"),
    ],
)
def test_invalid_values_name_the_rule(field, value, rule):
    with pytest.raises(ConfigError) as err:
        KvRouterParams(**{field: value})
    assert err.value.field == field
    assert rule in err.value.reason


def test_kv_events_are_needed_only_with_a_positive_weight():
    assert KvRouterParams().subscribes_to_kv_events
    assert not KvRouterParams(kv_overlap_score_weight=0.0).subscribes_to_kv_events
    assert not KvRouterParams(use_kv_events=False).subscribes_to_kv_events


def test_policy_names_match_the_registry():
    assert set(COST_POLICY_NAMES) == set(COST_POLICIES)


@pytest.mark.parametrize("kwargs", [{"kv_overlap_score_weight": -1.0}, {"router_temperature": -1.0}])
def test_override_is_validated(kwargs):
    with pytest.raises(ConfigError):
        RouterOverride(**kwargs)
