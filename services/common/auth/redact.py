"""Credentials never leave a process in an error or a log line.

`redact_url` replaces the userinfo of URLs (`http://user:password@host:1` ->
`http://***@host:1`), both when given one URL, with or without a scheme, and in free text
(an exception message that quotes a URL). Everything else is returned unchanged.
"""

from __future__ import annotations

import re

REDACTED = "***"

# scheme://userinfo@ or //userinfo@ anywhere in the text. The authority ends at / ? # or
# whitespace; the greedy class backtracks to its *last* "@", as URL parsers split there.
_USERINFO = re.compile(r"(?P<prefix>(?:\b[A-Za-z][A-Za-z0-9+.\-]*:)?//)[^/?#\s]*@")
_AUTHORITY = re.compile(r"[^/?#]*")


def redact_url(url: str) -> str:
    """`url` (or a text quoting URLs) with every userinfo replaced by `***`."""
    text = url if isinstance(url, str) else str(url)
    redacted = _USERINFO.sub(lambda m: f"{m.group('prefix')}{REDACTED}@", text)
    if redacted != text or "//" in text:
        return redacted
    # No "//": a scheme-less authority such as "user:pw@host:1" (what a careless caller types).
    authority = _AUTHORITY.match(text)
    assert authority is not None
    at = authority.group().rfind("@")
    if at < 0:
        return text
    return f"{REDACTED}{text[at:]}"
