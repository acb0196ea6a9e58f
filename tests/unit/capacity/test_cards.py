"""Card derivation rules and bad inputs (reference/thunderagent.md §2.4, §2.5, §6 lists)."""

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.capacity.core.cards import (
    MAX_TOKENS,
    CardCache,
    RetentionSettings,
    degradations,
    derive_card,
    parse_card,
    positive_int,
    recompute,
    round_up_to_pages,
)
from services.capacity.core.state import (
    Card,
    CardRejection,
    CardRejectReason,
    Degradation,
    Health,
    HostNotCounted,
    Origin,
    RetentionSource,
    WorkerState,
)


def info(**overrides):
    base = {
        "max_total_num_tokens": 16_000,
        "page_size": 16,
        "dp_size": 1,
        "model_path": "m",
        "version": "0.5.5",
        "max_running_requests": 64,
        "context_length": 32_768,
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not _DROP}


_DROP = object()


def hicache(**overrides):
    base = {
        "enable_hierarchical_cache": True,
        "hicache_write_policy": "write_back",
        "hicache_size": 0,
        "hicache_ratio": 2.0,
    }
    base.update(overrides)
    return info(**base)


def card(body) -> Card:
    result = derive_card(body)
    assert isinstance(result, Card), result
    return result


def healthy(worker_id, body) -> WorkerState:
    return WorkerState(
        worker_id=worker_id,
        url=f"http://{worker_id}:1",
        origin=Origin.RPC,
        registered_at=0.0,
        health=Health.HEALTHY,
        card=card(body),
    )


# --- positive_int: the shared validity rule ---


@pytest.mark.parametrize(
    "value, expected",
    [
        (300, 300),
        (123.9, 123),
        (0, None),
        (-1, None),
        (0.5, None),
        (True, None),
        (False, None),
        (None, None),
        ("300", None),
        (math.inf, None),
        (-math.inf, None),
        (math.nan, None),
        ([1], None),
    ],
)
def test_positive_int(value, expected):
    assert positive_int(value) == expected


# --- GPU tokens ---


@pytest.mark.parametrize(
    "tokens, page, expected",
    [
        (16_000, 16, 16_000),
        (16_001, 16, 16_016),
        (100, 1, 100),
        (100, 64, 128),
        (1, 16, 16),
    ],
)
def test_gpu_tokens_rounded_up_to_whole_pages(tokens, page, expected):
    c = card(info(max_total_num_tokens=tokens, page_size=page))
    assert c.gpu_kv_tokens == expected
    assert c.device_tokens == tokens
    assert c.page_size == page


def test_snapshot_extracts_kv_pool_tokens():
    # 16 x 1000 and 8 x 2000 pages are both 16,000 tokens, keyed (worker, 0).
    view = recompute(
        RetentionSettings(),
        [
            healthy("1", info(max_total_num_tokens=16_000, page_size=16)),
            healthy("2", info(max_total_num_tokens=16_000, page_size=8)),
        ],
    )
    assert [(r.worker_id, r.dp_rank, r.retention_tokens) for r in view.replicas()] == [
        ("1", 0, 16_000),
        ("2", 0, 16_000),
    ]
    assert all(r.source is RetentionSource.GPU_ONLY for r in view.replicas())


@given(st.integers(1, MAX_TOKENS), st.integers(1, 4096))
@settings(deadline=None)
def test_rounding_is_smallest_page_multiple_at_or_above(tokens, page):
    rounded = round_up_to_pages(tokens, page)
    assert rounded >= tokens and rounded % page == 0 and rounded - tokens < page


# --- Bad inputs: every one is a typed rejection, never a guessed budget ---


@pytest.mark.parametrize(
    "body, reason",
    [
        (info(max_total_num_tokens=_DROP), CardRejectReason.MAX_TOTAL_NUM_TOKENS_MISSING),
        (info(max_total_num_tokens=None), CardRejectReason.MAX_TOTAL_NUM_TOKENS_MISSING),
        (info(max_total_num_tokens=0), CardRejectReason.MAX_TOTAL_NUM_TOKENS_INVALID),
        (info(max_total_num_tokens=-5), CardRejectReason.MAX_TOTAL_NUM_TOKENS_INVALID),
        (info(max_total_num_tokens="abc"), CardRejectReason.MAX_TOTAL_NUM_TOKENS_INVALID),
        (info(max_total_num_tokens="16000"), CardRejectReason.MAX_TOTAL_NUM_TOKENS_INVALID),
        (info(max_total_num_tokens=True), CardRejectReason.MAX_TOTAL_NUM_TOKENS_INVALID),
        (info(max_total_num_tokens=math.nan), CardRejectReason.MAX_TOTAL_NUM_TOKENS_INVALID),
        (info(max_total_num_tokens=math.inf), CardRejectReason.MAX_TOTAL_NUM_TOKENS_INVALID),
        (info(max_total_num_tokens=2**40 + 1), CardRejectReason.MAX_TOTAL_NUM_TOKENS_ABSURD),
        (info(max_total_num_tokens=1e300), CardRejectReason.MAX_TOTAL_NUM_TOKENS_ABSURD),
        (info(page_size=_DROP), CardRejectReason.PAGE_SIZE_MISSING),
        (info(page_size=0), CardRejectReason.PAGE_SIZE_INVALID),
        (info(page_size=-16), CardRejectReason.PAGE_SIZE_INVALID),
        (info(page_size="16"), CardRejectReason.PAGE_SIZE_INVALID),
        (info(page_size=True), CardRejectReason.PAGE_SIZE_INVALID),
        (info(page_size=16.5), CardRejectReason.PAGE_SIZE_INVALID),
        (info(page_size=2**20), CardRejectReason.PAGE_SIZE_ABSURD),
        (info(dp_size=0), CardRejectReason.DP_SIZE_INVALID),
        (info(dp_size=-1), CardRejectReason.DP_SIZE_INVALID),
        (info(dp_size="2"), CardRejectReason.DP_SIZE_INVALID),
        (info(dp_size=True), CardRejectReason.DP_SIZE_INVALID),
        (info(dp_size=10**6), CardRejectReason.DP_SIZE_ABSURD),
        ([1, 2], CardRejectReason.NOT_AN_OBJECT),
        ("text", CardRejectReason.NOT_AN_OBJECT),
        (None, CardRejectReason.NOT_AN_OBJECT),
    ],
)
def test_snapshot_skips_malformed_cards(body, reason):
    result = derive_card(body)
    assert isinstance(result, CardRejection)
    assert result.reason is reason
    assert str(result).startswith("server_info: ")


@pytest.mark.parametrize("raw", [b"{not json", b"", b"\xff\xfe", b"[", '{"a": }'])
def test_malformed_json_is_rejected(raw):
    result = parse_card(raw)
    assert isinstance(result, CardRejection) and result.reason is CardRejectReason.MALFORMED_JSON


def test_rejected_worker_contributes_nothing_and_says_why():
    state = WorkerState(
        worker_id="w",
        url="http://w:1",
        origin=Origin.RPC,
        registered_at=0.0,
        health=Health.UNHEALTHY,
        rejection=derive_card(info(max_total_num_tokens=0)),
    )
    view = recompute(RetentionSettings(), [state, healthy("ok", info())])
    assert view.total_retention_tokens == 16_000
    bad = view.workers[1]
    assert bad.state.worker_id == "w" and bad.replicas == ()
    assert "max_total_num_tokens 0" in bad.excluded_reason


# --- HiCache host tokens (SGLang publisher list) ---


def test_hicache_publishes_native_offloading_capacity():
    c = card(hicache(hicache_host_total_tokens=300, max_total_num_tokens=100))
    assert (c.host_kv_tokens, c.host_not_counted) == (300, None)


def test_snapshot_adds_native_offloading_tokens_to_retention_budget():
    view = recompute(RetentionSettings(), [healthy("1", hicache(hicache_host_total_tokens=300))])
    (replica,) = view.replicas()
    assert replica.retention_tokens == 16_300
    assert replica.source is RetentionSource.GPU_PLUS_HOST
    assert (replica.gpu_kv_tokens, replica.host_kv_tokens) == (16_000, 300)


@pytest.mark.parametrize("bad", [None, False, True, 0, 0.5, -1, "300", math.inf, -math.inf, math.nan])
def test_hicache_native_offloading_capacity_ignores_invalid_values(bad):
    # Present but invalid: no host tokens and no fallback to ratio derivation.
    c = card(hicache(hicache_host_total_tokens=bad, hicache_ratio=4.0))
    assert c.host_kv_tokens == 0
    assert c.host_not_counted is HostNotCounted.HOST_TOKENS_INVALID


def test_snapshot_ignores_invalid_native_offloading_capacity():
    view = recompute(RetentionSettings(), [healthy("1", hicache(hicache_host_total_tokens="300"))])
    assert view.total_retention_tokens == 16_000
    assert view.replicas()[0].source is RetentionSource.GPU_ONLY


def test_host_tokens_truncated():
    assert card(hicache(hicache_host_total_tokens=123.9)).host_kv_tokens == 123


# --- Absurd magnitudes: no running SGLang server reports them, so the whole card is untrusted ---


@pytest.mark.parametrize(
    "overrides, reason, field",
    [
        (
            {"hicache_host_total_tokens": 2**41},
            CardRejectReason.HICACHE_HOST_TOTAL_TOKENS_ABSURD,
            "hicache_host_total_tokens",
        ),
        (
            {"hicache_host_total_tokens": 1e300},
            CardRejectReason.HICACHE_HOST_TOTAL_TOKENS_ABSURD,
            "hicache_host_total_tokens",
        ),
        ({"hicache_ratio": 1e305}, CardRejectReason.HICACHE_RATIO_ABSURD, "hicache_ratio"),
        ({"hicache_ratio": 10**400}, CardRejectReason.HICACHE_RATIO_ABSURD, "hicache_ratio"),
        ({"hicache_ratio": 4, "max_total_num_tokens": 2**39}, CardRejectReason.HICACHE_RATIO_ABSURD, "hicache_ratio"),
        ({"hicache_size": 1e300, "kv_bytes_per_token": 100}, CardRejectReason.HICACHE_SIZE_ABSURD, "hicache_size"),
        ({"hicache_size": 1e300}, CardRejectReason.HICACHE_SIZE_ABSURD, "hicache_size"),
        ({"hicache_size": 10**400, "kv_bytes_per_token": 1}, CardRejectReason.HICACHE_SIZE_ABSURD, "hicache_size"),
        ({"hicache_size": 2**19, "kv_bytes_per_token": 1}, CardRejectReason.HICACHE_SIZE_ABSURD, "hicache_size"),
    ],
)
def test_absurd_hicache_figures_reject_the_card(overrides, reason, field):
    # Regression (issue 11): 1e305 / 1e300 raised OverflowError / ValueError out of the poll.
    result = derive_card(hicache(**overrides))
    assert isinstance(result, CardRejection), result
    assert result.reason is reason
    assert str(result).startswith(f"server_info: {field} ") and "exceeds" in str(result)


def test_hicache_figures_are_ignored_when_hicache_is_off():
    c = card(info(hicache_ratio=1e305, hicache_size=1e300, hicache_host_total_tokens=2**60))
    assert (c.host_kv_tokens, c.hierarchical_cache) == (0, False)


@pytest.mark.parametrize("text", ["[" * 200_000, '{"a":' * 200_000, "[" * 100_000 + "]" * 100_000])
def test_deeply_nested_json_is_a_rejection(text):
    # Regression (issue 11): RecursionError escaped the poll.
    result = parse_card(text.encode())
    assert isinstance(result, CardRejection) and result.reason is CardRejectReason.JSON_TOO_DEEP
    assert str(result) == "server_info: JSON nested too deeply"


@pytest.mark.parametrize(
    "field", ["served_model_name", "model_path", "version", "hicache_write_policy", "hicache_storage_backend"]
)
def test_text_fields_are_bounded_and_encodable(field):
    long = derive_card(hicache(**{field: "x" * 10_000}))
    assert isinstance(long, CardRejection) and long.reason is CardRejectReason.TEXT_FIELD_TOO_LONG
    assert str(long).startswith(f"server_info: {field} ") and len(str(long)) < 200
    # A lone surrogate (valid JSON escape, not encodable as UTF-8) would break every snapshot.
    body = json.dumps(hicache(**{field: "\ud800"}))  # ensure_ascii: the escape \\ud800 travels as ASCII
    bad = parse_card(body.encode())
    assert isinstance(bad, CardRejection) and bad.reason is CardRejectReason.TEXT_FIELD_INVALID, bad
    assert str(bad).startswith(f"server_info: {field} ")
    str(bad).encode("utf-8")


@pytest.mark.parametrize(
    "value",
    ["x" * 1_000_000, [[[[1]]]] * 10_000, {"a": "b" * 100_000}, 10**5000, -(10**5000)],
    ids=["long-str", "long-list", "big-object", "huge-int", "huge-negative-int"],
)
def test_rejection_details_are_short_whatever_the_value(value):
    result = derive_card(info(max_total_num_tokens=value))
    assert isinstance(result, CardRejection)
    assert len(str(result)) < 200
    result = derive_card(info(page_size=value))
    assert isinstance(result, CardRejection) and len(str(result)) < 200


def test_odd_architectures_do_not_crash():
    for value in (5, 1.5, True, {"a": 1}, "DeepSeekV4ForCausalLM", None):
        assert isinstance(derive_card(hicache(architectures=value)), Card)


@pytest.mark.parametrize(
    "device, ratio, page, expected",
    [
        (100, 3, 16, 304),
        (416_864, 4, 16, 1_667_472),
        (1000, 2.0, 1, 2001),
        (1000, 1.5, 64, 1536),
    ],
)
def test_hicache_derives_ratio_based_write_back_capacity(device, ratio, page, expected):
    c = card(hicache(max_total_num_tokens=device, hicache_ratio=ratio, page_size=page))
    assert c.host_kv_tokens == expected


@pytest.mark.parametrize(
    "policy, expected, why",
    [
        ("write_back", 300, None),
        ("write_through", 200, None),
        ("write_through_selective", 0, HostNotCounted.WRITE_POLICY_NOT_COUNTED),
        ("something_new", 0, HostNotCounted.WRITE_POLICY_NOT_COUNTED),
        (None, 0, HostNotCounted.WRITE_POLICY_MISSING),
    ],
)
def test_hicache_capacity_accounts_for_write_policy(policy, expected, why):
    c = card(hicache(max_total_num_tokens=100, page_size=1, hicache_host_total_tokens=300, hicache_write_policy=policy))
    assert (c.host_kv_tokens, c.host_not_counted) == (expected, why)


def test_hicache_write_through_ignores_fully_overlapped_host_pool():
    c = card(
        hicache(
            max_total_num_tokens=300, page_size=1, hicache_host_total_tokens=100, hicache_write_policy="write_through"
        )
    )
    assert (c.host_kv_tokens, c.host_not_counted) == (0, HostNotCounted.FULLY_MIRRORED)


def test_write_through_ratio_derivation_subtracts_the_device_pool():
    # H = (floor(100*3)//16 + 1)*16 = 304; mirrored part D = 100 -> 204.
    c = card(hicache(max_total_num_tokens=100, hicache_ratio=3, hicache_write_policy="write_through"))
    assert c.host_kv_tokens == 204


@pytest.mark.parametrize(
    "overrides, why",
    [
        ({"enable_hierarchical_cache": False}, None),
        ({"enable_hierarchical_cache": "true"}, None),
        ({"hicache_size": 16}, HostNotCounted.EXPLICIT_SIZE_WITHOUT_BYTES_PER_TOKEN),
        ({"hicache_size": -1}, HostNotCounted.HICACHE_SIZE_INVALID),
        ({"hicache_size": "big"}, HostNotCounted.HICACHE_SIZE_INVALID),
        ({"hicache_write_policy": "write_through_selective"}, HostNotCounted.WRITE_POLICY_NOT_COUNTED),
        ({"dcp_size": 2}, HostNotCounted.DCP_UNSUPPORTED),
        ({"model_path": "deepseek-ai/DeepSeek-V4"}, HostNotCounted.MODEL_UNSUPPORTED),
        ({"hicache_ratio": None}, HostNotCounted.RATIO_INVALID),
        ({"hicache_ratio": 0}, HostNotCounted.RATIO_INVALID),
        ({"hicache_ratio": math.nan}, HostNotCounted.RATIO_INVALID),
    ],
)
def test_hicache_does_not_derive_unsupported_capacity(overrides, why):
    c = card(hicache(**overrides))
    assert c.host_kv_tokens == 0
    assert c.host_not_counted is why
    assert c.gpu_kv_tokens == 16_000  # the GPU budget is kept


def test_explicit_hicache_size_uses_reported_bytes_per_token():
    # 1 GB / 1000 B per token = 1,000,000 tokens -> aligned up: (1e6 // 16 + 1) * 16.
    c = card(hicache(hicache_size=1, kv_bytes_per_token=1000))
    assert c.host_kv_tokens == (1_000_000 // 16 + 1) * 16


def test_storage_backend_is_reported_never_counted():
    c = card(
        hicache(
            hicache_storage_backend="mooncake",
            hicache_write_policy="write_through",
            hicache_ratio=1.0,
            max_total_num_tokens=1600,
        )
    )
    # ratio 1: H = 1616, write_through counts only the 16 tokens beyond the mirrored device pool.
    assert c.hicache_storage_backend == "mooncake"
    assert c.host_kv_tokens == 16
    assert card(info(hicache_storage_backend="file")).host_kv_tokens == 0


# --- Retention: uncapped by default, opt-in cap ---


def test_host_credit_uncapped_by_default_and_capped_on_request():
    state = healthy("1", hicache(max_total_num_tokens=1000, page_size=1, hicache_host_total_tokens=5000))
    assert recompute(RetentionSettings(), [state]).total_retention_tokens == 6000
    capped = recompute(RetentionSettings(cap_host_at_gpu=True), [state])
    assert capped.total_retention_tokens == 2000
    assert capped.replicas()[0].host_kv_tokens == 1000


# --- Data parallel ---


def test_snapshot_expands_capacity_for_each_data_parallel_rank():
    view = recompute(RetentionSettings(), [healthy("1", info(dp_size=3))])
    assert [(r.worker_id, r.dp_rank, r.retention_tokens) for r in view.replicas()] == [
        ("1", 0, 16_000),
        ("1", 1, 16_000),
        ("1", 2, 16_000),
    ]  # per-rank capacity, not divided
    assert view.total_retention_tokens == 48_000


def test_dp_attention_divides_max_running_requests_per_rank():
    c = card(info(dp_size=4, enable_dp_attention=True, max_running_requests=256))
    assert (c.dp_size, c.max_running_requests) == (4, 64)
    assert card(info(dp_size=4, max_running_requests=256)).max_running_requests == 256
    view = recompute(
        RetentionSettings(), [healthy("1", info(dp_size=4, enable_dp_attention=True, max_running_requests=256))]
    )
    assert [r.max_programs for r in view.replicas()] == [64] * 4


@pytest.mark.parametrize("value", [None, 0, -3, "64", True, 1.5])
def test_max_programs_only_when_positive_int(value):
    assert card(info(max_running_requests=value)).max_running_requests == 0


def test_missing_dp_size_means_single_rank():
    assert card(info(dp_size=_DROP)).dp_size == 1


# --- Card metadata ---


def test_card_reports_metadata():
    c = card(hicache(served_model_name="served", hicache_storage_backend=None))
    assert (c.model_name, c.version, c.context_length, c.hicache_storage_backend) == ("served", "0.5.5", 32_768, "")
    assert c.hierarchical_cache and c.hicache_write_policy == "write_back"


# --- Memoisation ---


def test_parsed_cards_cache_hits_on_repeat_snapshot():
    cache = CardCache()
    body = json.dumps(info()).encode()
    first = cache.parse("w0", body)
    assert cache.parse("w0", body) is first
    assert (cache.hits, cache.misses) == (1, 1)


def test_card_cache_keeps_one_body_per_worker_when_every_poll_differs():
    """Regression (soak): under load every /server_info body is new; an LRU of old bodies grew for minutes."""
    cache = CardCache()
    for n in range(500):
        for worker in ("w0", "w1"):
            cache.parse(worker, json.dumps(info(max_total_num_tokens=1000 + n)).encode())
    assert len(cache) == 2 and cache.hits == 0


def test_card_cache_hits_only_on_the_same_workers_last_body():
    cache = CardCache()
    a, b = (json.dumps(info(max_total_num_tokens=n)).encode() for n in (100, 200))
    cache.parse("w0", a)
    cache.parse("w1", a)  # same body, other worker: its own entry
    cache.parse("w0", b)
    cache.parse("w0", a)  # an old body of w0's is parsed again
    assert (cache.hits, cache.misses) == (0, 4)
    cache.parse("w0", a)
    cache.forget("w1")
    assert cache.hits == 1 and len(cache) == 1


def test_snapshot_returns_empty_for_no_workers():
    view = recompute(RetentionSettings(), [])
    assert (view.workers, view.total_retention_tokens, view.replica_count) == ((), 0, 0)


def test_pending_and_unhealthy_workers_excluded_with_reason():
    pending = WorkerState(worker_id="p", url="http://p:1", origin=Origin.FLAG, registered_at=0.0)
    sick = healthy("s", info())
    from dataclasses import replace

    sick = replace(sick, health=Health.UNHEALTHY)
    view = recompute(RetentionSettings(), [pending, sick])
    assert view.total_retention_tokens == 0
    assert [w.excluded_reason for w in view.workers] == [
        "pending: no successful poll yet",
        "unhealthy: polls failing (last: unknown)",
    ]


@given(
    st.dictionaries(
        st.sampled_from(
            [
                "max_total_num_tokens",
                "page_size",
                "dp_size",
                "hicache_ratio",
                "hicache_host_total_tokens",
                "enable_hierarchical_cache",
                "hicache_write_policy",
                "hicache_size",
                "max_running_requests",
            ]
        ),
        st.one_of(st.none(), st.booleans(), st.integers(-(2**50), 2**50), st.floats(), st.text(max_size=5)),
        max_size=6,
    )
)
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_input_yields_a_card_or_a_typed_rejection(overrides):
    result = derive_card({**hicache(), **overrides})
    if isinstance(result, Card):
        assert 0 < result.gpu_kv_tokens <= MAX_TOKENS + result.page_size
        assert 0 <= result.host_kv_tokens <= MAX_TOKENS
        assert result.dp_size >= 1
    else:
        assert isinstance(result.reason, CardRejectReason)


CACHE_OFF, PRIORITY_OFF = Degradation.CACHE_REPORT_OFF, Degradation.PRIORITY_SCHEDULING_OFF


@pytest.mark.parametrize(
    "args, expected",
    [
        ({"enable_cache_report": True, "enable_priority_scheduling": True}, ()),
        ({"enable_cache_report": False, "enable_priority_scheduling": True}, (CACHE_OFF,)),
        ({"enable_cache_report": True, "enable_priority_scheduling": False}, (PRIORITY_OFF,)),
        ({"enable_cache_report": False, "enable_priority_scheduling": False}, (CACHE_OFF, PRIORITY_OFF)),
        # SGLang publishes every server argument: one it does not say is on is taken as off.
        ({}, (CACHE_OFF, PRIORITY_OFF)),
        ({"enable_cache_report": None, "enable_priority_scheduling": True}, (CACHE_OFF,)),
        ({"enable_cache_report": "true", "enable_priority_scheduling": 1}, (CACHE_OFF, PRIORITY_OFF)),
    ],
)
def test_degradations_name_each_server_argument_that_is_not_explicitly_on(args, expected):
    assert degradations(info(**args)) == expected
    derived = card(info(**args))
    assert derived.degraded == expected
    # A degraded worker serves: its budget is whole and its card is accepted.
    assert derived.gpu_kv_tokens == 16_000


def test_each_degradation_names_its_server_argument_and_flag():
    assert (CACHE_OFF.server_arg, CACHE_OFF.flag) == ("enable_cache_report", "--enable-cache-report")
    assert (PRIORITY_OFF.server_arg, PRIORITY_OFF.flag) == (
        "enable_priority_scheduling",
        "--enable-priority-scheduling",
    )
    assert "degraded=cache_report_off" in card(info(enable_priority_scheduling=True)).describe()
    assert "degraded" not in card(info(enable_cache_report=True, enable_priority_scheduling=True)).describe()
