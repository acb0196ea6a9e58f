"""Credentials never leave the router in an error or a log line.

`redact` masks URL userinfo (services.common.auth.redact), the value of credential headers quoted in text
(`Authorization: ...`, `Proxy-Authorization`, `X-Api-Key`, `Api-Key`, `Cookie`), bearer/basic tokens
and OpenAI-style `sk-...` keys. `install_log_redaction()` puts `RedactingFilter` on the root logger's
handlers, so every record the process writes (ours, aiohttp's, grpc's; message and traceback) passes
through `redact` once, at the handler. Client-facing error messages are built without credentials in
the first place (worker ids, not URLs; never a header's bytes); a worker's own error text is redacted.
"""

from __future__ import annotations

import logging
import re

from services.common.auth.redact import REDACTED, redact_url

_HEADER = re.compile(
    r"(?i)\b(authorization|proxy-authorization|x-api-key|api-key|cookie)(\s*[:=]\s*)"
    r"[^\r\n,;'\"]+"
)
_TOKEN = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=\-]{4,}")
_KEY = re.compile(r"\bsk-[A-Za-z0-9_\-]{8,}")


def redact(text: str) -> str:
    text = redact_url(text)
    text = _HEADER.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
    text = _TOKEN.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    return _KEY.sub(f"sk-{REDACTED}", text)


class RedactingFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def install_log_redaction(logger: logging.Logger | None = None) -> None:
    """Add a RedactingFilter to each handler of `logger` (default: root) that has none yet."""
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
