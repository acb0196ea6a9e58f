"""bench/peer_proxy.py's pure parts: the usage read from a stream's tail, and its flags."""

from __future__ import annotations

import argparse

import pytest

from bench.peer_proxy import _usage_of, build_parser, check_args
from services.common.settings.errors import ConfigError

USAGE = b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":120,"completion_tokens":7,"total_tokens":127}}\n\n'
CHUNK = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
DONE = b"data: [DONE]\n\n"


@pytest.mark.parametrize(
    "tail, expected",
    [
        (CHUNK + USAGE + DONE, {"prompt_tokens": 120, "completion_tokens": 7, "total_tokens": 127}),
        (USAGE, {"prompt_tokens": 120, "completion_tokens": 7, "total_tokens": 127}),
        (CHUNK + DONE, {}),  # no usage asked for
        (b"", {}),
        (b'data: {"choices":[],"usage":{"prompt_tok', {}),  # cut short: no usage rather than a guess
    ],
)
def test_usage_of_the_stream_tail(tail, expected):
    assert _usage_of(tail) == expected


def test_usage_split_across_the_last_two_reads_is_found():
    whole = CHUNK + USAGE + DONE
    cut = len(CHUNK) + 30
    previous, last = whole[:cut], whole[cut:]
    assert _usage_of(previous + last)["prompt_tokens"] == 120


def _args(*extra: str) -> argparse.Namespace:
    return build_parser().parse_args(["--policy", "thunderagent", "--worker-urls", "http://w:1", "--port", "0", *extra])


@pytest.mark.parametrize(
    "flags, field",
    [(("--speedup", "0"), "speedup"), (("--port", "70000"), "port"), (("--request-timeout-seconds", "0"), None)],
)
def test_bad_flags_name_the_rule(flags, field):
    with pytest.raises(ConfigError) as exc:
        check_args(_args(*flags))
    assert exc.value.field == (field or "request_timeout_seconds")


def test_the_policy_must_be_a_peer():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--policy", "kv", "--worker-urls", "http://w:1", "--port", "0"])
    check_args(_args("--speedup", "4"))
