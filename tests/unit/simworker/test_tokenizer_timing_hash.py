"""Tokenizer rule, timing profiles, and the SGLang page-hash rule."""

from __future__ import annotations

import hashlib
import random
import struct

import pytest

from services.common.settings.errors import ConfigError
from services.simworker.core import tokenizer
from services.simworker.core.radix import page_hashes
from services.simworker.core.timing import host_tokens_from_gb, profile_from_fields
from services.simworker.profiles import builtin_profiles, load_profile

# -- tokenizer -------------------------------------------------------------------------------


def test_pieces_follow_the_documented_rule():
    ids = tokenizer.encode(" hello world  ")
    assert len(ids) == 5  # " hell", "o", " worl", "d", "  "
    assert tokenizer.encode(" hell") == ids[:1]
    assert all(tokenizer.HASH_ID_BASE <= i < tokenizer.VOCAB_SIZE for i in ids)


def test_ids_are_stable_across_versions():
    # Pinned values: changing the rule breaks every recorded prefix hash.
    assert tokenizer.encode(" ba be") == [256, 257]
    assert tokenizer.encode("hello") == tokenizer.encode("hello")
    assert (
        tokenizer.encode("hello")[0]
        == 16_384 + int.from_bytes(hashlib.blake2b(b"hell", digest_size=8).digest(), "little") % tokenizer.HASH_VOCAB
    )


@pytest.mark.parametrize("n, seed", [(0, 0), (1, 1), (17, 2), (5000, 3)])
def test_text_of_n_tokens_is_exact_and_decodes_back(n, seed):
    text = tokenizer.text_of_n_tokens(n, seed)
    ids = tokenizer.encode(text)
    assert len(ids) == n
    assert ids == tokenizer.ids_of_n_tokens(n, seed)
    assert tokenizer.decode(ids) == text
    assert tokenizer.text_of_n_tokens(n, seed) == text


@pytest.mark.parametrize("n, seed", [(0, 0), (1, 1), (17, 2), (5000, 3)])
def test_drawn_words_are_the_ones_random_choices_draws(n, seed):
    # ids_of_n_tokens draws in one pass what rng.choices(range(NUM_WORDS), k=n) draws (pinned:
    # every simulated prompt, and so every recorded result, depends on these draws).
    rng = random.Random(seed)
    expected = [tokenizer.WORD_ID_BASE + i for i in rng.choices(range(tokenizer.NUM_WORDS), k=n)]
    assert tokenizer.ids_of_n_tokens(n, seed) == expected
    assert tokenizer.text_of_n_tokens(n, seed) == "".join(tokenizer.WORDS[i - tokenizer.WORD_ID_BASE] for i in expected)


@pytest.mark.parametrize(
    "ids",
    [[], [2], [256, 2, 300, 0, 1], [tokenizer.WORD_ID_BASE + tokenizer.NUM_WORDS - 1], [256, 20_000, 2], [-1, 256]],
)
def test_decode_follows_the_per_id_rule(ids):
    def by_rule(ids):
        out = []
        for token_id in ids:
            i = token_id - tokenizer.WORD_ID_BASE
            if 0 <= i < tokenizer.NUM_WORDS:
                out.append(tokenizer.WORDS[i])
            elif token_id >= tokenizer.WORD_ID_BASE:
                out.append(tokenizer.WORDS[tokenizer.NUM_WORDS - 1 - token_id % (tokenizer.NUM_WORDS - 90)])
        return "".join(out)

    assert tokenizer.decode(ids) == by_rule(ids)
    if all(0 <= token_id < tokenizer.WORD_ID_BASE + tokenizer.NUM_WORDS for token_id in ids):
        assert tokenizer.table_text(ids) == by_rule(ids)  # the unchecked path, for ids in its table


def test_generated_words_round_trip_and_eos_is_skipped():
    ids = [tokenizer.word_id(i) for i in (0, 5, 8000, 123)]
    assert tokenizer.encode(tokenizer.decode(ids)) == ids
    assert tokenizer.decode([tokenizer.EOS_TOKEN_ID]) == ""
    assert all(len(w.strip()) <= 4 and w.startswith(" ") for w in tokenizer.WORDS)


# -- timing ----------------------------------------------------------------------------------


def test_builtin_profiles_and_default_formulas():
    assert {"glm45-fp8-h200", "mocker-h100"} <= set(builtin_profiles())
    glm = load_profile("glm45-fp8-h200")
    assert glm.decode_ms(95_000, 0) == pytest.approx(26.2, abs=0.1)  # TIMING.md §4b bs4
    assert glm.decode_ms(640_000, 0) == pytest.approx(63.8, abs=0.1)  # §5 table, batch 32 x 20K
    # Linear continuation above the 800K knee with the slope at the knee.
    slope = glm.decode_ms(900_000, 0) - glm.decode_ms(899_000, 0)
    assert slope == pytest.approx(0.0209, abs=1e-3)
    # Closed form at concurrency 1: frontend + step + chunk = TIMING's isolated TTFT.
    t, context = 1000, 40_000
    isolated = 53.7 + 0.0531 * t + 1.378e-6 * t * (context - t / 2) + 0.00259 * context
    ours = glm.frontend_s(context) * 1000 + glm.decode_ms(0, 0) + glm.prefill_chunk_ms(t, context - t)
    assert ours == pytest.approx(isolated, rel=0.01)
    mocker = load_profile("mocker-h100")
    assert mocker.decode_ms(0, 100) == pytest.approx(5.74)
    assert mocker.prefill_batch_ms(1000) + mocker.prefill_chunk_ms(1000, 0) == pytest.approx(
        4.209989e-7 * 1e6 + 0.01518344 * 1000 + 16.50142
    )


def test_host_load_time_and_size_helpers():
    glm = load_profile("glm45-fp8-h200")
    assert glm.host_load_s(10_000) == pytest.approx(10_000 * 376_832 / 100e9)
    assert host_tokens_from_gb(100, 376_832) == int(100e9 // 376_832)
    with pytest.raises(ConfigError):
        host_tokens_from_gb(-1, 376_832)


def test_overrides_and_profile_files(tmp_path):
    p = load_profile("glm45-fp8-h200", {"host_bandwidth_bytes_per_s": "5e10", "frontend_base_ms": 0})
    assert p.host_bandwidth_bytes_per_s == 5e10 and p.frontend_base_ms == 0.0
    toml = tmp_path / "mine.toml"
    toml.write_text('base = "mocker-h100"\nkv_bytes_per_token = 1024\n')
    mine = load_profile(str(toml))
    assert mine.name == "mine" and mine.kv_bytes_per_token == 1024 and mine.decode_x == "kv_utilisation"
    js = tmp_path / "full.json"
    js.write_text('{"base": "glm45-fp8-h200", "name": "x", "decode_e0_ms": 20}')
    assert load_profile(js).decode_e0_ms == 20.0


def test_the_core_builds_a_profile_from_fields_handed_in():
    """core/timing.py reads no file: the shell hands it the fields (strings from flags coerced)."""
    glm = load_profile("glm45-fp8-h200")
    fields = {f: getattr(glm, f) for f in glm.__dataclass_fields__}
    assert profile_from_fields(fields, label="x") == glm
    derived = profile_from_fields(fields, {"decode_e0_ms": "20", "decode_on_prefill_only_steps": "false"}, label="x")
    assert (derived.decode_e0_ms, derived.decode_on_prefill_only_steps) == (20.0, False)
    with pytest.raises(ConfigError) as info:
        profile_from_fields({"name": "partial", "decode_x": "context_k"}, label="partial.json")
    assert (info.value.field, info.value.value) == ("profile", "partial.json")
    assert "missing fields" in info.value.reason


@pytest.mark.parametrize(
    "name, overrides, field",
    [
        ("no-such-profile", None, "profile"),
        ("glm45-fp8-h200", {"bogus": 1}, "profile.bogus"),
        ("glm45-fp8-h200", {"kv_bytes_per_token": 0}, "kv_bytes_per_token"),
        ("glm45-fp8-h200", {"decode_x": "batch"}, "decode_x"),
        ("glm45-fp8-h200", {"prefill_ms_per_token": "fast"}, "profile.prefill_ms_per_token"),
        ("glm45-fp8-h200", {"decode_e1_ms": 0.0}, "decode_x_knee"),
        ("missing.json", None, "profile"),
    ],
)
def test_bad_profiles_raise_config_error(name, overrides, field):
    with pytest.raises(ConfigError) as info:
        load_profile(name, overrides)
    assert info.value.field == field


# -- page hash -------------------------------------------------------------------------------


def test_page_hash_is_sglang_sha256_chain_as_signed_int64():
    tokens = list(range(100, 137))  # 2 full pages of 16, a partial tail
    hashes = page_hashes(tokens, 16)
    assert len(hashes) == 2
    d0 = hashlib.sha256(struct.pack("<16I", *tokens[:16])).hexdigest()
    d1 = hashlib.sha256(bytes.fromhex(d0) + struct.pack("<16I", *tokens[16:32])).hexdigest()
    as_int64 = [struct.unpack(">q", bytes.fromhex(d[:16]))[0] for d in (d0, d1)]
    assert hashes == as_int64
    assert page_hashes(tokens[:32] + [9], 16) == hashes  # the tail does not matter
    assert page_hashes([5] + tokens[1:], 16)[1] != hashes[1]  # chained: page 0 changes page 1


@pytest.mark.parametrize(
    "ids",
    [[], [300], [256, 8445, 4000], tokenizer.ids_of_n_tokens(500, 3), [2], [300, 2], [300, 20_000], [8446], [300, 255]],
)
def test_words_text_is_decode_of_word_ids_and_none_otherwise(ids):
    words_only = all(tokenizer.WORD_ID_BASE <= i < tokenizer.WORD_ID_BASE + tokenizer.NUM_WORDS for i in ids)
    assert tokenizer.words_text(ids) == (tokenizer.decode(ids) if words_only else None)
