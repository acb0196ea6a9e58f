"""`python -m bench.peer_proxy`: a peer system (harness/peers) as a live front door to simworkers or SGLang.

    python -m bench.peer_proxy --policy thunderagent|continuum --worker-urls URL [URL ...] \\
        --port P [--host 127.0.0.1] [--speedup S]

It serves the OpenAI chat completions API (streaming and not) that clients/player.py speaks: the program
is the `X-Dynamo-Session-ID` header, `X-Dynamo-Session-Final: true` releases it (answered here, never
forwarded). Each turn asks the policy core for a backend; a turn it holds waits here, bytes untouched,
until the core wakes its program. The worker's SSE bytes are relayed as read; only the block holding
the usage chunk is looked at, after the stream. Requests without a session header pass through round
robin. Capacity is each worker's KV pool (`max_total_num_tokens` of /server_info); token counts come
from each completion's usage; a turn's prompt is estimated from its body size at the bytes-per-token
ratio the usages have shown so far.

The core's clock is the wall clock times `--speedup`: its constants (ThunderAgent's Δt = 5 s, its
decay and 30 min forced resume; Continuum's tool averages and TTLs) are the paper's in simulated
seconds, exactly as the simulator's arm runs them, as `bandmaster up --speedup` scales the scheduler.
GET /peer/stats returns the core's counters.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import sys
import time
from typing import Sequence

import aiohttp
from aiohttp import web

from harness.peers import PEERS, ContinuumParams, PeerPolicy, ThunderAgentParams, Wake
from harness.simlib.scenario import make_peer
from services.common.settings.errors import ConfigError
from services.common.web.session_ids import FINAL_HEADER, SESSION_HEADER
from services.simworker.profiles import load_profile

log = logging.getLogger("bench.peer_proxy")

SESSION = SESSION_HEADER
FINAL = FINAL_HEADER
START_TIMEOUT_S = 60.0
# Before any usage was seen: about 4 bytes of chat JSON per token; learned from usage after that.
INITIAL_TOKENS_PER_BYTE = 0.25
TOKENS_PER_BYTE_ALPHA = 0.2


class PeerProxy:
    """The shell around one policy core: holds turns, runs the monitor and timers, relays bytes."""

    def __init__(self, core: PeerPolicy, workers: Sequence[str], speedup: float, request_timeout_s: float) -> None:
        self.core = core
        self.workers = list(workers)
        self.speedup = speedup
        self.request_timeout_s = request_timeout_s
        self._t0 = time.monotonic()
        self._held: dict[str, asyncio.Future[int]] = {}
        self._changed = asyncio.Event()
        self._rr = 0
        self.tokens_per_byte = INITIAL_TOKENS_PER_BYTE
        self.session: aiohttp.ClientSession | None = None
        self._loop_task: asyncio.Task | None = None
        self.turns_total = 0
        self.held_total = 0
        self.hold_timeouts_total = 0
        self.turns_without_usage_total = 0

    def now(self) -> float:
        """The core's clock: simulated seconds (wall seconds times the workers' speedup)."""
        return (time.monotonic() - self._t0) * self.speedup

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self, app: web.Application) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=self.request_timeout_s, sock_connect=10),
        )
        self._loop_task = asyncio.create_task(self._control_loop())

    async def stop(self, app: web.Application) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            try:
                await self._loop_task
            except asyncio.CancelledError:
                pass
        if self.session is not None:
            await self.session.close()

    # -- the core's monitor and timers -------------------------------------------------------------

    async def _control_loop(self) -> None:
        interval = self.core.monitor_interval_s
        next_monitor = self.now() + interval if interval is not None else math.inf
        while True:
            timer = self.core.next_timer()
            due = min(next_monitor, timer if timer is not None else math.inf)
            wait_s = (due - self.now()) / self.speedup
            if wait_s > 0:
                self._changed.clear()
                try:
                    # Bounded: re-evaluated at least every second, and whenever the core changed.
                    await asyncio.wait_for(self._changed.wait(), min(wait_s, 1.0))
                except asyncio.TimeoutError:
                    pass
                continue
            now = self.now()
            if interval is not None and now >= next_monitor:
                next_monitor = now + interval
            self._deliver(self.core.tick(now))

    def _deliver(self, wakes: list[Wake]) -> None:
        for wake in wakes:
            future = self._held.pop(wake.program_id, None)
            if future is not None and not future.done():
                future.set_result(wake.backend)
        self._changed.set()

    # -- HTTP ------------------------------------------------------------------------------------

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        program = request.headers.get(SESSION, "").strip()
        if program and request.headers.get(FINAL, "").strip().lower() == "true":
            self._deliver(self.core.release(self.now(), program))
            return web.json_response({"released": program})
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return web.json_response({"error": {"message": "the body is not a JSON object"}}, status=400)
        if not program:
            self._rr += 1
            passed, _ = await self._forward(request, self.workers[self._rr % len(self.workers)], raw, body)
            return passed
        if body.get("stream") and not (body.get("stream_options") or {}).get("include_usage"):
            # The core needs the usage: ask the worker for it (the client then sees one usage chunk more).
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
            raw = json.dumps(body).encode()
        self.turns_total += 1
        backend = self.core.begin_turn(self.now(), program, max(1, round(len(raw) * self.tokens_per_byte)))
        self._changed.set()
        if backend is None:
            backend = await self._hold(program)
            if backend is None:
                return web.json_response({"error": {"message": "held past the proxy's bound"}}, status=503)
        prompt_tokens = completion_tokens = 0
        try:
            response, usage = await self._forward(request, self.workers[backend], raw, body)
            prompt_tokens = int(usage.get("prompt_tokens") or 0)
            completion_tokens = int(usage.get("completion_tokens") or 0)
            if prompt_tokens <= 0:
                self.turns_without_usage_total += 1
            else:
                a = TOKENS_PER_BYTE_ALPHA
                self.tokens_per_byte = a * prompt_tokens / len(raw) + (1 - a) * self.tokens_per_byte
            return response
        finally:
            self._deliver(self.core.end_turn(self.now(), program, prompt_tokens, completion_tokens))

    async def _hold(self, program: str) -> int | None:
        self.held_total += 1
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._held[program] = future
        try:
            return await asyncio.wait_for(future, self.request_timeout_s)
        except asyncio.TimeoutError:
            self.hold_timeouts_total += 1
            log.warning("program %s held longer than %.0fs: answered 503", program, self.request_timeout_s)
            return None
        finally:
            if self._held.get(program) is future:
                del self._held[program]

    async def _forward(
        self, request: web.Request, worker: str, raw: bytes, body: dict
    ) -> tuple[web.StreamResponse, dict]:
        """Send the turn to `worker`; relay its answer. Returns the response and the usage seen."""
        assert self.session is not None
        async with self.session.post(
            worker + "/v1/chat/completions", data=raw, headers={"Content-Type": "application/json"}
        ) as upstream:
            if not body.get("stream") or upstream.status != 200:
                data = await upstream.read()
                usage: dict = {}
                if upstream.status == 200:
                    try:
                        usage = json.loads(data).get("usage") or {}
                    except ValueError:
                        pass
                return web.Response(body=data, status=upstream.status, content_type="application/json"), usage
            response = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            previous = last = b""
            try:
                async for data in upstream.content.iter_any():
                    await response.write(data)
                    previous, last = last, data
                await response.write_eof()
            except ConnectionResetError:
                # The client went away. After [DONE] that is normal (a client may close without
                # reading the stream's end): the turn is over and its usage counts either way.
                pass
            return response, _usage_of(previous + last)


def _usage_of(tail: bytes) -> dict:
    """The usage object of the stream's last usage chunk, from its last bytes (the chunk precedes [DONE])."""
    at = tail.rfind(b'"usage":{')
    if at < 0:
        return {}
    start = tail.rfind(b"data: ", 0, at)
    end = tail.find(b"\n", at)
    try:
        return json.loads(tail[start + 6 : end if end >= 0 else None]).get("usage") or {}
    except ValueError:
        return {}


async def read_capacities(workers: Sequence[str], timeout_s: float = START_TIMEOUT_S) -> tuple[list[int], int]:
    """Each worker's KV pool tokens and the first one's chunked prefill size, from /server_info."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        capacities, chunk = [], 0
        for url in workers:
            while True:
                try:
                    async with session.get(url + "/server_info") as response:
                        info = await response.json()
                    capacities.append(int(info["max_total_num_tokens"]))
                    chunk = chunk or int(info.get("chunked_prefill_size") or 8192)
                    break
                except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, ValueError):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{url}/server_info did not answer within {timeout_s:.0f}s") from None
                    await asyncio.sleep(0.2)
    return capacities, chunk


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_proxy", description=__doc__.splitlines()[0])
    parser.add_argument("--policy", required=True, choices=PEERS)
    parser.add_argument("--worker-urls", nargs="+", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--speedup", type=float, default=1.0, help="the workers' --speedup (scales the core's clock)")
    parser.add_argument("--timing-profile", default="glm45-fp8-h200", help="Continuum's reload-cost model")
    parser.add_argument(
        "--request-timeout-seconds", type=float, default=1800.0, help="bound on a held turn and on a worker's answer"
    )
    parser.add_argument("--log-level", default="WARNING")
    return parser


def check_args(args: argparse.Namespace) -> None:
    if not (math.isfinite(args.speedup) and args.speedup > 0):
        raise ConfigError("speedup", args.speedup, "speedup > 0")
    if not 0 <= args.port <= 65535:
        raise ConfigError("port", args.port, "0 <= port <= 65535")
    if not args.request_timeout_seconds > 0:
        raise ConfigError("request_timeout_seconds", args.request_timeout_seconds, "> 0")


async def serve(args: argparse.Namespace) -> None:
    workers = [u.rstrip("/") for u in args.worker_urls]
    capacities, chunk = await read_capacities(workers)
    core = make_peer(
        args.policy, capacities, ThunderAgentParams(), ContinuumParams(), load_profile(args.timing_profile), chunk
    )
    assert core is not None
    proxy = PeerProxy(core, workers, args.speedup, args.request_timeout_seconds)
    app = web.Application(client_max_size=256 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", proxy.chat_completions)

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def stats(_: web.Request) -> web.Response:
        return web.json_response(
            {
                "pauses": 0,  # the bench report's common columns (Continuum never pauses)
                "forced_resumes": 0,
                **core.counters(),
                "turns": proxy.turns_total,
                "held_turns": proxy.held_total,
                "hold_timeouts": proxy.hold_timeouts_total,
                "turns_without_usage": proxy.turns_without_usage_total,
            }
        )

    app.router.add_get("/health", health)
    app.router.add_get("/peer/stats", stats)
    app.on_startup.append(proxy.start)
    app.on_cleanup.append(proxy.stop)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    log.warning(
        "peer proxy %s on %s:%d over %d workers %s", args.policy, args.host, args.port, len(workers), capacities
    )
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_args(args)
    except ConfigError as exc:
        print(f"bench.peer_proxy: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
