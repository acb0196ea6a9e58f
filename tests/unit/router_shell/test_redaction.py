"""Credentials are masked in every log record the router writes and in the worker error text it relays."""

from __future__ import annotations

import io
import logging

import aiohttp
import pytest

from services.router.observe.redaction import RedactingFilter, install_log_redaction, redact
from tests.support.router_doubles import MODEL
from tests.support.router_inprocess import InProcessRouter


@pytest.mark.parametrize(
    "text, secret",
    [
        ("Authorization: Bearer sk-abc123def456ghi", "abc123"),
        ("header line b'authorization: Basic dXNlcjpwYXNz\\x01'", "dXNlcjpwYXNz"),
        ("proxy-authorization=Token hunter2", "hunter2"),
        ("X-Api-Key: k3y-material", "k3y-material"),
        ("Cookie: session=s3cr3t; other=1", "s3cr3t"),
        ("calling http://admin:hunter2@10.0.0.1:30000/generate failed", "hunter2"),
        ("key sk-proj-ABCDEFGHIJKLMNOP in a message", "ABCDEFGHIJKLMNOP"),
        ("token bearer eyJhbGciOiJIUzI1NiJ9.payload.sig", "eyJhbGci"),
    ],
)
def test_redact_masks_credentials(text, secret):
    out = redact(text)
    assert secret not in out and "***" in out


def test_redact_leaves_ordinary_text_alone():
    text = "worker w1 answered 500: CUDA out of memory at http://10.0.0.1:30000/generate"
    assert redact(text) == text


def test_the_filter_redacts_messages_arguments_and_tracebacks():
    stream = io.StringIO()
    logger = logging.getLogger("test.redaction")
    logger.propagate = False
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    install_log_redaction(logger)
    install_log_redaction(logger)
    assert sum(isinstance(f, RedactingFilter) for f in handler.filters) == 1
    try:
        logger.warning("bad header %s", "Authorization: Bearer sk-live-1234567890")
        try:
            raise ValueError("could not reach http://u:pw-9876@host:1/x")
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    out = stream.getvalue()
    assert "sk-live-1234567890" not in out and "pw-9876" not in out and out.count("***") >= 2
    assert "ValueError" in out  # the traceback is still there


async def test_a_workers_error_text_is_relayed_without_credentials():
    r = await InProcessRouter.start(["refuse"], worker_failure_threshold=0)
    r.workers[0].error_message = "upstream http://admin:hunter2@db:5432 refused; Authorization: Bearer sk-zzzzzzzzzz"
    try:
        async with aiohttp.ClientSession() as s:
            async with s.post(
                r.url + "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
            ) as resp:
                assert resp.status == 502
                text = await resp.text()
        assert "hunter2" not in text and "sk-zzzzzzzzzz" not in text and "w0" in text
        assert r.workers[0].url not in text  # workers are named by id, never by URL
    finally:
        await r.close()
