"""The SSE relay: what of a worker's SSE bytes reaches the client, and what the router learns from them.

The token path does no JSON work except on the chunk that carries usage (or, for /generate, the last
chunk), and no logging. `SseRelay` forwards each read from the worker as one block when C-level byte
tests show it holds only plain data and blank lines; only the lines from a usage chunk on, or a block
with a line that needs attention (an error event, a suppressed blank, anything else), are taken apart
line by line. No I/O: the open
turn (open_turn.py) reads the worker and feeds the relay.
"""

from __future__ import annotations

import enum
from typing import Callable

from orjson import dumps, loads

from services.router.observe.redaction import redact
from services.router.turn.turn_types import Api


class LineKind(enum.Enum):
    DATA = 0  # a data line to forward
    USAGE = 1  # OpenAI usage-only chunk (choices: [])
    DONE = 2  # data: [DONE]
    BLANK = 3  # event separator
    ERROR = 4  # data: {"error": ...}: the worker failed mid-stream (never forwarded)


class SseRelay:
    """What of a worker's SSE bytes reaches the client, one read at a time. No I/O.

    `feed(data)` takes the bytes of one read and returns the bytes to forward: the whole lines so far
    (a trailing partial line waits for the next read; `end()` flushes it). A block of only data lines
    and blank lines, none of them an error event, is returned as it is, after a handful of `bytes.count`
    calls; in a block with a usage chunk (OpenAI APIs) that holds for the lines before it, and only the
    rest goes line by line. Any other block goes through `classify` line by line, which is the one
    statement of the rules:

    * `data: [DONE]` is forwarded; `data: {"error"...` stops the stream (`error` is set and what came
      before it in the block is returned);
    * every other data line is an output chunk (`chunks`); for /generate the last one carries the usage;
    * an OpenAI chunk with `"usage":{` is parsed (`absorb_usage`); a usage-only chunk (no choices)
      gets `prompt_tokens_details` and is forwarded only with `include_usage`, else it and the next
      blank line are dropped;
    * blank lines (event separators) are forwarded; other lines (comments, `event:`) are not.
    """

    def __init__(self, api: Api, include_usage: bool, absorb_usage: Callable[[dict], None]) -> None:
        self._generate = api is Api.GENERATE
        self._include_usage = include_usage
        self._absorb_usage = absorb_usage
        self._partial = b""
        self._skip_blank = False
        self._last_data = b""  # /generate: a block whose last data line is the latest chunk
        self.chunks = 0  # data lines seen, [DONE] and errors excluded
        self.error: str | None = None

    def complete_lines(self, data: bytes) -> bytes:
        """`data` after the partial line kept from before, up to its last newline (the rest is kept)."""
        if self._partial:
            data = self._partial + data
        cut = data.rfind(b"\n") + 1
        if cut == len(data):
            self._partial = b""
            return data
        self._partial = data[cut:]
        return data[:cut]

    def take_partial(self) -> bytes:
        tail, self._partial = self._partial, b""
        return tail

    def feed(self, data: bytes) -> bytes:
        block = self.complete_lines(data)
        if not block:
            return b""
        if self._skip_blank:
            return self._by_line(block)
        # Only the lines from the first usage chunk on are taken apart: a read that holds a whole short
        # answer (a loaded router reads seldom) forwards its content lines as one block all the same.
        cut = len(block)
        if not self._generate:
            usage_at = block.find(b'"usage":{')
            if usage_at >= 0:
                cut = block.rfind(b"\n", 0, usage_at) + 1
        if cut and self._plain(block if cut == len(block) else block[:cut]):
            return block if cut == len(block) else block[:cut] + self._by_line(block[cut:])
        return self._by_line(block)

    def _plain(self, block: bytes) -> bool:
        """True (and the books kept) when every line of `block` is a data line or a blank line and none is
        an error event. The counts find distinct lines, so they add up to the number of lines only if that
        holds (a miscount sends the block line by line)."""
        if b'data: {"error"' in block:
            return False
        data_lines = block.count(b"\ndata:") + block.startswith(b"data:")
        if data_lines + block.count(b"\n\n") + block.startswith(b"\n") != block.count(b"\n"):
            return False
        done = block.count(b"\ndata: [DONE]") + block.startswith(b"data: [DONE]")
        if data_lines > done:
            self.chunks += data_lines - done
            if self._generate:
                self._last_data = block
        return True

    def end(self) -> bytes:
        """The worker closed the stream: a last line without a newline is still a line."""
        tail = self.take_partial()
        return self._by_line(tail) if tail else b""

    def last_data_line(self) -> bytes | None:
        """/generate: the last data chunk of the stream (None if there was none)."""
        lines = [
            line
            for line in split_lines(self._last_data)
            if line.startswith(b"data:") and not line.startswith(b"data: [DONE]")
        ]
        return lines[-1] if lines else None

    def _by_line(self, block: bytes) -> bytes:
        out: list[bytes] = []
        for line in split_lines(block):
            line, kind = self.classify(line)
            if kind is LineKind.DATA or kind is LineKind.DONE:
                out.append(line)
            elif kind is LineKind.BLANK:
                if self._skip_blank:
                    self._skip_blank = False
                else:
                    out.append(line)
            elif kind is LineKind.USAGE:
                if self._include_usage:
                    out.append(line)
                else:
                    self._skip_blank = True
            elif kind is LineKind.ERROR:
                self.error = stream_error(line)
                break
        return b"".join(out)

    def classify(self, line: bytes) -> tuple[bytes, LineKind | None]:
        """One line: (the line to forward, possibly rewritten; its kind, None = not forwarded)."""
        if line.startswith(b"data:"):
            if line.startswith(b"data: [DONE]"):
                return line, LineKind.DONE
            if line.startswith(b'data: {"error"'):
                return line, LineKind.ERROR
            self.chunks += 1
            if self._generate:
                self._last_data = line
            elif b'"usage":{' in line:
                chunk = loads(memoryview(line)[5:])
                self._absorb_usage(chunk)
                if not chunk.get("choices"):
                    # Once per turn: make prompt_tokens_details.cached_tokens always present.
                    if ensure_cached_details(chunk):
                        line = b"data: " + dumps(chunk) + b"\n"
                    return line, LineKind.USAGE
            return line, LineKind.DATA
        if line == b"\n" or line == b"\r\n":
            return line, LineKind.BLANK
        return line, None


def split_lines(block: bytes) -> list[bytes]:
    """`block` cut after every newline (the last piece may have none); no other separator counts."""
    lines = block.split(b"\n")
    last = lines.pop()
    lines = [line + b"\n" for line in lines]
    if last:
        lines.append(last)
    return lines


def ensure_cached_details(chunk: dict) -> bool:
    """SGLang omits `prompt_tokens_details` unless it runs with --enable-cache-report and hit the cache;
    clients get it always (0 when the worker reported nothing). True when `chunk` was changed."""
    usage = chunk.get("usage")
    if not isinstance(usage, dict) or isinstance(usage.get("prompt_tokens_details"), dict):
        return False
    usage["prompt_tokens_details"] = {"cached_tokens": 0}
    return True


def stream_error(line: bytes) -> str:
    try:
        err = loads(memoryview(line)[5:]).get("error")
        return redact(str(err.get("message") if isinstance(err, dict) else err))
    except Exception:
        return "worker reported an error mid-stream"
