import pytest

from services.common.auth.redact import redact_url


@pytest.mark.parametrize(
    "url, expected",
    [
        ("http://user:password@10.0.0.5:30000", "http://***@10.0.0.5:30000"),
        ("https://user@host:1/prefix?x=1", "https://***@host:1/prefix?x=1"),
        ("http://a@b:c@host:1/p", "http://***@host:1/p"),  # parsers split at the last @
        ("http://:secret@[::1]:8080", "http://***@[::1]:8080"),
        ("//user:pw@host:1", "//***@host:1"),
        ("user:pw@host:1", "***@host:1"),  # no scheme at all
        ("user:pw@host:1/a@b", "***@host:1/a@b"),  # an @ in the path is not userinfo
        ("http://host:1/path@x", "http://host:1/path@x"),
        ("http://host:1", "http://host:1"),
        ("", ""),
        ("not a url", "not a url"),
    ],
)
def test_redact_url(url, expected):
    assert redact_url(url) == expected


def test_redact_urls_quoted_in_text():
    text = "url 'http://u:p@h:1': bad; also see ftp://x:y@z/a and http://ok:2/"
    assert redact_url(text) == "url 'http://***@h:1': bad; also see ftp://***@z/a and http://ok:2/"


def test_secret_never_survives():
    for url in ("http://user:hunter2@h:1", "hunter2@h:1", "x http://hunter2@h/ y", "HTTP://me:hunter2@H:1"):
        assert "hunter2" not in redact_url(url)
