"""`bandmaster bench` names each failed program's reason on the console, not only in the --out JSON."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from aiohttp import web

from clients.player import TurnRecord, failure_lines
from services import cli


def _turn(program: str, k: int, error: str = "") -> TurnRecord:
    return TurnRecord(
        program,
        k,
        ok=not error,
        ttft_s=0.1,
        turn_s=0.2,
        prompt_tokens=0,
        cached_tokens=0,
        completion_tokens=0,
        error=error,
    )


@pytest.mark.parametrize(
    ("turns", "expected"),
    [
        ([_turn("a", 0), _turn("a", 1)], []),
        ([_turn("a", 0), _turn("a", 1, "HTTP 400: too big")], ["failed: a turn 1: HTTP 400: too big"]),
        (
            [_turn("a", 3, "finish_reason=abort"), _turn("b", 0, "no tokens"), _turn("a", 4, "later")],
            ["failed: a turn 3: finish_reason=abort", "failed: b turn 0: no tokens"],
        ),
        ([_turn("a", 0, "line one\n  line two")], ["failed: a turn 0: line one line two"]),
    ],
)
def test_one_line_per_failed_program_with_its_first_error(turns, expected):
    assert failure_lines(turns) == expected


def test_a_long_reason_is_cut_to_one_bounded_line():
    (line,) = failure_lines([_turn("a", 0, "x" * 1000)], limit_chars=50)
    assert line == "failed: a turn 0: " + "x" * 47 + "..."


class _RefusingEndpoint:
    """An OpenAI-style endpoint on 127.0.0.1:0 (own thread and loop) that answers every turn 400."""

    def __enter__(self) -> str:
        ready = threading.Event()
        self.loop = asyncio.new_event_loop()

        async def chat(request: web.Request) -> web.Response:
            body = await request.json()
            if not body["messages"]:  # the final request that releases a program
                return web.json_response({})
            message = "prompt of 20000 tokens does not fit the KV pool (16384 tokens)"
            return web.json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=400)

        async def start() -> None:
            app = web.Application()
            app.router.add_post("/v1/chat/completions", chat)
            self.runner = web.AppRunner(app)
            await self.runner.setup()
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]
            ready.set()

        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(start(), self.loop)
        assert ready.wait(10)
        return f"http://127.0.0.1:{self.port}/v1"

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_bench_prints_each_failed_programs_reason(tmp_path, capsys):
    out = tmp_path / "report.json"
    with _RefusingEndpoint() as endpoint:
        status = cli.main(
            ["bench", "--endpoint", endpoint, "--workload", "short", "--programs", "3", "--out", str(out)]
        )
    assert status == 1
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.startswith("failed: ")]
    assert len(lines) == 3
    for line in lines:
        assert "turn 0: HTTP 400:" in line and "does not fit the KV pool" in line
    summary = json.loads(captured.out)
    assert (summary["programs_done"], summary["turns_failed"]) == (0, 3)
    assert len(json.loads(out.read_text())["turns"]) == 3
