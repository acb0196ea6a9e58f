"""JSON from a client, with its nesting bounded: one place, for every HTTP edge that parses a body.

`json.loads` raises RecursionError (a 500 with a traceback) on input nested about a thousand deep, and
what parses deeper than `MAX_JSON_DEPTH` cannot be forwarded anyway (the router re-encodes bodies with
orjson, which refuses more than 254 levels). `loads_bounded` refuses both with `JsonTooDeep`, a
ValueError the edge maps to a 400. Pure: no I/O.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

MAX_JSON_DEPTH = 254
"""Most nested containers (objects and arrays) a body may have: what orjson will still encode."""


class JsonTooDeep(ValueError):
    """The JSON nests deeper than the bound (or than the parser's own recursion allows)."""


def json_depth(value: Any) -> int:
    """How many containers deep `value` nests (a scalar is 0). Iterative: any depth is safe."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, (dict, list)):
            continue
        children: Iterable[Any] = item.values() if isinstance(item, dict) else item
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def loads_bounded(text: str | bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """`json.loads(text)`, refusing nesting deeper than `max_depth` with JsonTooDeep; malformed JSON
    raises json.JSONDecodeError as before."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise JsonTooDeep(f"JSON nested deeper than {max_depth} levels") from None
    # Depth cannot exceed the number of opening brackets: most bodies are never walked.
    opening = text.count("[") + text.count("{") if isinstance(text, str) else text.count(b"[") + text.count(b"{")
    if opening > max_depth and json_depth(value) > max_depth:
        raise JsonTooDeep(f"JSON nested deeper than {max_depth} levels")
    return value
