"""OpenAI Batch API input rules, pure: the JSONL file, the completion window, object shapes.

Limits (documented in docs/planner.md):
* at most `max_requests` lines per input file (default 50,000, OpenAI's own limit) — above it the
  upload is refused with 413; at most `max_file_bytes` bytes (default 200 MB, OpenAI's) — 413;
* every line a JSON object {custom_id, method: "POST", url, body}; `custom_id` a non-empty string
  of at most 512 characters, unique in the file; `url` one of SUPPORTED_ENDPOINTS; `body` an
  object. Any violation refuses the whole file with 400 naming the line (nothing is stored);
* `completion_window`: OpenAI accepts only "24h"; we accept `<integer><s|m|h|d>` between
  MIN_WINDOW_S (1 minute) and MAX_WINDOW_S (7 days). "0s", "-1h", "1000d" or "soon" are 400.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from services.common.web.json_body import MAX_JSON_DEPTH, JsonTooDeep, loads_bounded

SUPPORTED_ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
BATCH_STATUSES = (
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
)
TERMINAL_STATUSES = frozenset({"failed", "completed", "expired", "cancelled"})
DEFAULT_MAX_REQUESTS = 50_000
DEFAULT_MAX_FILE_BYTES = 200 * 1024 * 1024
MAX_CUSTOM_ID_CHARS = 512
MIN_WINDOW_S = 60
MAX_WINDOW_S = 7 * 24 * 3600
_WINDOW = re.compile(r"^([0-9]{1,9})([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


MAX_ID_CHARS = 64
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")


def check_id(value: str, field: str) -> str:
    """An object id (file, batch, job, pool) as a client may name it: 1-64 characters of [A-Za-z0-9._:-],
    starting with a letter or digit. Ids are keys and appear in logs, lease records and error messages:
    anything else (control bytes, a kilobyte of text) is refused before it is stored or echoed."""
    if not _ID.match(value):
        shown = value[:16].encode("unicode_escape").decode("ascii")
        raise ValueError(
            f"{field} must be 1-{MAX_ID_CHARS} characters of letters, digits and '._:-' "
            f"(got {shown!r}{'...' if len(value) > 16 else ''})"
        )
    return value


class BatchInputError(ValueError):
    """Bad input. `status` is the HTTP status (400 or 413); `param`/`line` locate it."""

    def __init__(
        self,
        message: str,
        *,
        code: str = "invalid_request_error",
        status: int = 400,
        param: str | None = None,
        line: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.param = param
        self.line = line


@dataclass(frozen=True)
class BatchLine:
    index: int
    custom_id: str
    method: str
    url: str
    body: dict


def parse_completion_window(text: object) -> int:
    """'24h' -> 86400. Raises BatchInputError for anything outside the documented set."""
    if not isinstance(text, str):
        raise BatchInputError("completion_window must be a string such as '24h'", param="completion_window")
    m = _WINDOW.match(text.strip())
    if not m:
        raise BatchInputError(
            f"completion_window {text!r} is not '<integer><s|m|h|d>' (e.g. '24h')", param="completion_window"
        )
    seconds = int(m.group(1)) * _UNIT_S[m.group(2)]
    if not MIN_WINDOW_S <= seconds <= MAX_WINDOW_S:
        raise BatchInputError(f"completion_window {text!r} must be between 1m and 7d", param="completion_window")
    return seconds


def parse_batch_input(
    data: bytes, *, max_requests: int = DEFAULT_MAX_REQUESTS, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
) -> list[BatchLine]:
    """Validate a whole batch input file; the first violation refuses it."""
    if len(data) > max_file_bytes:
        raise BatchInputError(
            f"file is {len(data)} bytes; the limit is {max_file_bytes}", code="file_too_large", status=413, param="file"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BatchInputError("file is not UTF-8 text", param="file") from None
    out: list[BatchLine] = []
    seen: dict[str, int] = {}
    lines = text.splitlines()
    # Count before parsing so a huge file is refused cheaply.
    if sum(1 for ln in lines if ln.strip()) > max_requests:
        raise BatchInputError(
            f"file has more than {max_requests} requests", code="too_many_requests", status=413, param="file"
        )
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            item = loads_bounded(raw)
        except JsonTooDeep:
            raise BatchInputError(
                f"line {number}: JSON nested deeper than {MAX_JSON_DEPTH} levels", code="invalid_json_line", line=number
            ) from None
        except json.JSONDecodeError as exc:
            raise BatchInputError(
                f"line {number}: invalid JSON ({exc.msg})", code="invalid_json_line", line=number
            ) from None
        if not isinstance(item, dict):
            raise BatchInputError(f"line {number}: must be a JSON object", code="invalid_json_line", line=number)
        custom_id = item.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID_CHARS:
            raise BatchInputError(
                f"line {number}: custom_id must be a non-empty string of at most {MAX_CUSTOM_ID_CHARS} characters",
                code="invalid_custom_id",
                line=number,
            )
        if custom_id in seen:
            raise BatchInputError(
                f"line {number}: duplicate custom_id {custom_id!r} (first on line {seen[custom_id]})",
                code="duplicate_custom_id",
                line=number,
            )
        seen[custom_id] = number
        method = item.get("method", "POST")
        if method != "POST":
            raise BatchInputError(f"line {number}: method must be POST", code="invalid_method", line=number)
        url = item.get("url")
        if url not in SUPPORTED_ENDPOINTS:
            raise BatchInputError(
                f"line {number}: url {url!r} is not supported (supported: {', '.join(SUPPORTED_ENDPOINTS)})",
                code="unsupported_url",
                line=number,
            )
        body = item.get("body")
        if not isinstance(body, dict):
            raise BatchInputError(f"line {number}: body must be a JSON object", code="invalid_body", line=number)
        if body.get("stream"):
            raise BatchInputError(
                f"line {number}: streaming is not supported in a batch", code="invalid_body", line=number
            )
        out.append(BatchLine(len(out), custom_id, method, url, body))
    if not out:
        raise BatchInputError("file has no requests", code="empty_file", param="file")
    return out


def check_endpoint(endpoint: object, lines_urls: set[str]) -> str:
    if endpoint not in SUPPORTED_ENDPOINTS:
        raise BatchInputError(
            f"endpoint {endpoint!r} is not supported (supported: {', '.join(SUPPORTED_ENDPOINTS)})", param="endpoint"
        )
    other = sorted(u for u in lines_urls if u != endpoint)
    if other:
        raise BatchInputError(
            f"the input file has requests for {', '.join(other)}, not only {endpoint}", param="input_file_id"
        )
    return endpoint
