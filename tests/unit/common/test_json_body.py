"""loads_bounded: client JSON with its nesting bounded, never a RecursionError."""

import json

import pytest

from services.common.web.json_body import MAX_JSON_DEPTH, JsonTooDeep, json_depth, loads_bounded


def nested(depth: int, opening: str = "[", closing: str = "]") -> str:
    return opening * depth + closing * depth


@pytest.mark.parametrize(
    "value, depth",
    [(1, 0), ([], 1), ({"a": [1, {"b": []}]}, 4), ([[], [[[]]]], 4)],
)
def test_json_depth(value, depth):
    assert json_depth(value) == depth


@pytest.mark.parametrize("text", [nested(MAX_JSON_DEPTH), nested(MAX_JSON_DEPTH).encode()])
def test_the_bound_itself_parses(text):
    assert json_depth(loads_bounded(text)) == MAX_JSON_DEPTH


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 5_000, 200_000])
def test_deeper_is_refused_as_too_deep(depth):
    with pytest.raises(JsonTooDeep):
        loads_bounded(nested(depth))
    with pytest.raises(JsonTooDeep):
        loads_bounded('{"a": ' * depth + "1" + "}" * depth)


def test_brackets_inside_strings_do_not_count():
    assert loads_bounded(json.dumps({"text": "[" * 10_000})) == {"text": "[" * 10_000}


def test_malformed_json_is_still_a_decode_error():
    with pytest.raises(json.JSONDecodeError):
        loads_bounded("{not json")
