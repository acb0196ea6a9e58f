"""What the fuzz modules share: hypothesis settings, a rig that owns one event loop for a whole module
(a server per example is too slow), a log watch that catches unhandled errors, and value strategies.

`make test` runs each property with `NORMAL_EXAMPLES`-sized budgets, derandomized so CI is deterministic;
the `slow` twins (`make test-slow`) run random examples, >= 10,000 across the fuzz modules.
"""

from __future__ import annotations

import asyncio
import logging
import math

import grpc
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
NORMAL = settings(deadline=None, suppress_health_check=_SUPPRESS, derandomize=True, database=None)
SLOW = settings(deadline=None, suppress_health_check=_SUPPRESS)

# What a call may end with: OK or a deliberate client error. RESOURCE_EXHAUSTED is deliberate only where a
# service rate-limits (the router's per-client limits); elsewhere it meant status details too long to send.
CLIENT_ERRORS = frozenset(
    {
        grpc.StatusCode.OK,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.OUT_OF_RANGE,
    }
)
RATE_LIMITED = grpc.StatusCode.RESOURCE_EXHAUSTED

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
UINT32_MAX, UINT64_MAX = 2**32 - 1, 2**64 - 1


class LoopRig:
    """One event loop for all examples of a module; `run(coro)` runs a coroutine on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.errors = ErrorLog()

    def run(self, coro, timeout_s: float = 30.0):
        async def bounded():
            async with asyncio.timeout(timeout_s):
                return await coro

        return self.loop.run_until_complete(bounded())

    def close(self) -> None:
        self.errors.remove()
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()


class ErrorLog(logging.Handler):
    """Every ERROR (or worse) record logged while installed: an unhandled exception, a crashed poller."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []
        logging.getLogger().addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def remove(self) -> None:
        logging.getLogger().removeHandler(self)

    def check(self) -> None:
        if self.records:
            lines = [f"{r.name}: {r.getMessage()}" for r in self.records]
            self.records.clear()
            raise AssertionError("errors were logged:\n" + "\n".join(lines))


# -- values -------------------------------------------------------------------------------------------

# Characters a parser trips over: controls, DEL, NUL, separators, bidi marks, BOM, non-BMP, lone surrogates.
ODD_CHARS = st.sampled_from(
    [
        "\x00",
        "\x01",
        "\x1b",
        "\x7f",
        "\t",
        "\n",
        "\r",
        " ",
        "\u00a0",
        "\u0085",
        "\u2028",
        "\u202e",
        "\ufeff",
        "\uffff",
        "\U0001f600",
        "\U0010ffff",
        "\ud800",
        "\udfff",
        "é",
        "€",
        "\\",
        '"',
        "'",
        "%",
        "/",
        ":",
        ";",
        ",",
        "=",
        "{",
        "}",
        "[",
        "]",
    ]
)
ODD_TEXT = st.one_of(
    st.text(max_size=12),
    st.text(alphabet=ODD_CHARS, max_size=12),
    st.lists(st.one_of(st.text(max_size=4), ODD_CHARS), max_size=6).map("".join),
    st.text(st.characters(codec="ascii"), max_size=40),
    st.integers(250, 300).map(lambda n: "s" * n),  # around the 256-byte id bound
    st.integers(1, 4).map(lambda n: "x" * 10**n),  # long
    st.sampled_from(["", " ", "  a  ", "a b", "null", "NaN", "-1", "0", "true", "../../etc/passwd", "%00", "${x}"]),
)
# Protobuf strings are UTF-8: lone surrogates become "?" (raw invalid UTF-8 is sent as bytes by the wire fuzzers).
PROTO_TEXT = ODD_TEXT.map(lambda t: t.encode("utf-8", "replace").decode("utf-8"))
INT_EXTREMES = st.sampled_from(
    [
        0,
        1,
        -1,
        2,
        INT32_MAX,
        INT32_MAX + 1,
        INT32_MIN,
        INT32_MIN - 1,
        INT64_MAX,
        INT64_MIN,
        UINT32_MAX,
        UINT64_MAX,
        2**53 + 1,
        10**12,
    ]
)
FLOAT_EXTREMES = st.sampled_from(
    [
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        1e-300,
        5e-324,
        1e300,
        -1e300,
        1.7976931348623157e308,
        math.inf,
        -math.inf,
        math.nan,
        86_400.0,
        86_400.5,
        2.0**63,
    ]
)


def int_in(low: int, high: int) -> st.SearchStrategy[int]:
    """Integers of a field's range, biased to its edges."""
    return st.one_of(
        st.integers(low, high),
        INT_EXTREMES.filter(lambda v: low <= v <= high),
        st.sampled_from([low, high, min(max(0, low), high)]),
    )


def floats_any() -> st.SearchStrategy[float]:
    return st.one_of(st.floats(allow_nan=True, allow_infinity=True), FLOAT_EXTREMES)
