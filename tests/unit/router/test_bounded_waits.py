"""The pure rules of issue 21 (bounded waits): a turn's answer deadline, the workers' prefill rates, and
whether a prompt fits the model's context."""

from __future__ import annotations

import pytest

from services.router.core.context_fit import (
    MAX_CHARS_PER_TOKEN,
    chat_content_chars,
    context_limit,
    overflow,
    text_token_floor,
)
from services.router.core.deadline import DeadlineParams, PrefillRates, answer_deadline_s

P = DeadlineParams(floor_s=2.0, prior_prefill_tokens_per_s=4000.0, min_sample_tokens=256, alpha=0.5)


@pytest.mark.parametrize(
    "uncached, rate, cap, expected",
    [
        (0, 4000.0, 60.0, 2.0),  # nothing to prefill: the floor
        (8000, 4000.0, 60.0, 4.0),  # floor + 8000 / 4000
        (400_000, 4000.0, 60.0, 60.0),  # capped
        (8000, 0.0, 60.0, 4.0),  # no rate: the prior
        (8000, 16000.0, 60.0, 2.5),  # a fast worker
        (0, 4000.0, 1.0, 1.0),  # a cap below the floor wins (a short first-token timeout)
        (-5, 4000.0, 60.0, 2.0),  # a negative prediction counts as nothing
    ],
)
def test_answer_deadline_is_floor_plus_prefill_capped(uncached, rate, cap, expected):
    assert answer_deadline_s(P, uncached, rate, cap) == pytest.approx(expected)


def test_the_deadline_is_seconds_not_the_first_token_timeout():
    """Before issue 21 every streamed turn waited the whole 60 s first-token timeout for a frozen worker."""
    default = DeadlineParams()
    assert answer_deadline_s(default, 2000, default.prior_prefill_tokens_per_s, 60.0) < 5.0


@pytest.mark.parametrize(
    "bad", [dict(floor_s=0), dict(floor_s=-1), dict(prior_prefill_tokens_per_s=0), dict(alpha=0), dict(alpha=1.5)]
)
def test_invalid_deadline_params_are_refused(bad):
    with pytest.raises(ValueError):
        DeadlineParams(**bad)


def test_prefill_rates_learn_from_large_streamed_turns_only():
    rates = PrefillRates(P)
    assert rates.rate("w") == 4000.0  # the prior
    assert not rates.observe("w", 100, 0.01)  # too small to say anything about prefill
    assert not rates.observe("w", 10_000, 0.0)  # no time measured
    assert rates.rate("w") == 4000.0
    assert rates.observe("w", 10_000, 1.0)
    assert rates.rate("w") == 10_000.0  # the first sample replaces the prior
    assert rates.observe("w", 20_000, 1.0)
    assert rates.rate("w") == 15_000.0  # EWMA, alpha 0.5
    assert rates.deadline_s("w", 30_000, 60.0) == pytest.approx(4.0)
    assert rates.deadline_s("other", 8000, 60.0) == pytest.approx(4.0)  # per worker


def test_prefill_rates_forget_workers_that_left():
    rates = PrefillRates(P)
    rates.observe("a", 10_000, 1.0)
    rates.observe("b", 10_000, 1.0)
    rates.forget(["b"])
    assert rates.rate("a") == 4000.0 and rates.rate("b") == 10_000.0


# -- context length ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "lengths, expected",
    [([4096], 4096), ([4096, 8192], 8192), ([4096, 0], 0), ([], 0), ([0], 0)],
)
def test_the_limit_is_the_largest_context_and_unknown_when_any_worker_did_not_say(lengths, expected):
    assert context_limit(lengths) == expected


@pytest.mark.parametrize(
    "tokens, refused",
    [(4095, False), (4096, True), (5000, True), (1, False)],  # SGLang: refused when n >= context_length
)
def test_exact_token_counts_follow_sglangs_rule(tokens, refused):
    verdict = overflow(4096, token_count=tokens, text_chars=0)
    assert (verdict is not None) == refused
    if verdict is not None:
        assert verdict.exact and verdict.prompt_tokens == tokens and verdict.context_length == 4096
        assert "4096" in verdict.message() and str(tokens) in verdict.message()


@pytest.mark.parametrize(
    "chars, refused",
    [
        (4096 * 4, False),  # ~4096 tokens by the usual estimate: maybe, so the worker decides
        (4095 * MAX_CHARS_PER_TOKEN, False),  # at least 4095 tokens: may fit
        (4095 * MAX_CHARS_PER_TOKEN + 1, True),  # at least ceil(chars / 16) = 4096 tokens: certain
        (4096 * MAX_CHARS_PER_TOKEN * 3, True),
    ],
)
def test_text_is_refused_only_when_certain(chars, refused):
    verdict = overflow(4096, token_count=None, text_chars=chars)
    assert (verdict is not None) == refused
    if verdict is not None:
        assert not verdict.exact and "at least" in verdict.message()
        assert verdict.prompt_tokens == text_token_floor(chars) >= 4096


def test_an_unknown_limit_refuses_nothing():
    assert overflow(0, token_count=10**9, text_chars=10**9) is None


def test_chat_characters_are_the_contents_only():
    messages = [
        {"role": "system", "content": "abc"},
        {"role": "user", "content": [{"type": "text", "text": "defg"}, {"type": "image_url", "image_url": {}}]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "x"}]},
        "not a message",
    ]
    assert chat_content_chars(messages) == 7


# -- flags ------------------------------------------------------------------------------------------


def test_the_flags_map_to_the_deadline_params_and_the_context_switch():
    from services.router.config import load_config

    default = load_config([], {})
    assert default.answer_deadlines == DeadlineParams(2.0, 4000.0)
    assert default.failover_probe_timeout_seconds == 3.0 and default.context_length_check
    c = load_config(
        ["--failover-floor-seconds", "1.5", "--failover-probe-timeout-seconds", "0.5", "--no-context-length-check"],
        {"BANDMASTER_ROUTER_FAILOVER_PREFILL_TOKENS_PER_SECOND": "20000"},
    )
    assert c.answer_deadlines == DeadlineParams(1.5, 20000.0)
    assert c.failover_probe_timeout_seconds == 0.5 and not c.context_length_check


@pytest.mark.parametrize(
    "flag", ["--failover-floor-seconds", "--failover-prefill-tokens-per-second", "--failover-probe-timeout-seconds"]
)
def test_a_non_positive_failover_setting_refuses_to_start_naming_the_rule(flag):
    from services.common.settings.errors import ConfigError
    from services.router.config import load_config

    name = flag[2:].replace("-", "_")
    with pytest.raises(ConfigError, match=f"{name} > 0"):
        load_config([flag, "0"], {})
