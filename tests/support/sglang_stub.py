"""A small HTTP server shaped like SGLang for everything the capacity service reads.

It serves `/server_info` and `/get_server_info` (the body is a mutable dict), `/health`, and a
control API so tests and demos can change the info, break either endpoint (HTTP status,
hang past any deadline, malformed JSON) or restart the server with new info:

    POST /_stub/info     {...}                              replace the info dict
    POST /_stub/fail     {"target": "health"|"server_info", "mode": "ok"|"status"|"hang"|"malformed",
                          "status": 500}
    POST /_stub/restart  {"info": {...}, "down_seconds": 0.2}   go away, come back with new info
    GET  /_stub/state                                         counters and modes

In-process tests use the same operations as methods. Run standalone with
`python -m tests.support.sglang_stub --port P --max-total-num-tokens N ...`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from typing import Any

from aiohttp import web

FAIL_MODES = ("ok", "status", "hang", "malformed")
TARGETS = ("health", "server_info")


def sglang_info(
    *,
    max_total_num_tokens: int = 65_536,
    page_size: int = 16,
    dp_size: int = 1,
    max_running_requests: int | None = 256,
    model_path: str = "stub/model",
    enable_hierarchical_cache: bool = False,
    hicache_ratio: float = 2.0,
    hicache_size: int = 0,
    hicache_write_policy: str = "write_through",
    hicache_storage_backend: str | None = None,
    hicache_host_total_tokens: int | None = None,
    enable_dp_attention: bool = False,
    context_length: int = 32_768,
    version: str = "0.5.5-stub",
    enable_cache_report: bool = True,
    enable_priority_scheduling: bool = True,
) -> dict[str, Any]:
    """A /server_info body with the fields (and shape) a real SGLang server has."""
    info: dict[str, Any] = {
        # ServerArgs (a subset, under their Python names)
        "model_path": model_path,
        "served_model_name": model_path,
        "tp_size": 1,
        "dp_size": dp_size,
        "page_size": page_size,
        "max_running_requests": max_running_requests,
        "max_total_tokens": None,
        "chunked_prefill_size": 8192,
        "schedule_policy": "fcfs",
        "enable_dp_attention": enable_dp_attention,
        "context_length": context_length,
        "enable_hierarchical_cache": enable_hierarchical_cache,
        "hicache_ratio": hicache_ratio,
        "hicache_size": hicache_size,
        "hicache_write_policy": hicache_write_policy,
        "hicache_io_backend": "kernel",
        "hicache_mem_layout": "layer_first",
        "hicache_storage_backend": hicache_storage_backend,
        "enable_metrics": False,
        # As docs/getting-started.md starts SGLang (SGLang's own defaults are off for both).
        "enable_cache_report": enable_cache_report,
        "enable_priority_scheduling": enable_priority_scheduling,
        "disaggregation_mode": "null",
        "mem_fraction_static": 0.88,
        # scheduler_info
        "status": "ready",
        "max_total_num_tokens": max_total_num_tokens,
        "max_req_input_len": context_length - 1,
        "internal_states": [{"last_gen_throughput": 0.0, "memory_usage": {"kvcache": 1.0}}],
        "version": version,
    }
    if hicache_host_total_tokens is not None:
        info["hicache_host_total_tokens"] = hicache_host_total_tokens
    return info


class SglangStub:
    def __init__(
        self, info: dict[str, Any] | None = None, *, host: str = "127.0.0.1", port: int = 0, legacy_only: bool = False
    ) -> None:
        self.info: dict[str, Any] = info if info is not None else sglang_info()
        self.host = host
        self.port = port
        self.legacy_only = legacy_only  # only /get_server_info, as SGLang before the rename
        self.modes = {"health": "ok", "server_info": "ok"}
        self.statuses = {"health": 503, "server_info": 500}
        self.requests = {"health": 0, "server_info": 0}
        self._runner: web.AppRunner | None = None
        self._release = asyncio.Event()
        self._restart_task: asyncio.Task | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # --- operations (also behind the control API) ---

    def set_info(self, info: dict[str, Any]) -> None:
        self.info = info

    def fail(self, target: str, mode: str, status: int | None = None) -> None:
        if target not in TARGETS or mode not in FAIL_MODES:
            raise ValueError(f"target must be one of {TARGETS}, mode one of {FAIL_MODES}")
        self.modes[target] = mode
        if status is not None:
            self.statuses[target] = status
        if mode != "hang":
            self._release.set()
            self._release = asyncio.Event()

    def heal(self) -> None:
        for target in TARGETS:
            self.fail(target, "ok")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/server_info", self._server_info)
        app.router.add_get("/get_server_info", self._server_info)
        app.router.add_get("/health", self._health)
        # Any path prefix answers too, so one stub can stand in for many workers (http://h:p/w17).
        app.router.add_get("/{prefix:.+}/server_info", self._server_info)
        app.router.add_get("/{prefix:.+}/get_server_info", self._server_info)
        app.router.add_get("/{prefix:.+}/health", self._health)
        app.router.add_post("/_stub/info", self._ctl_info)
        app.router.add_post("/_stub/fail", self._ctl_fail)
        app.router.add_post("/_stub/restart", self._ctl_restart)
        app.router.add_get("/_stub/state", self._ctl_state)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def restart(self, info: dict[str, Any] | None = None, down_seconds: float = 0.0) -> None:
        """Stop listening, wait, come back on the same port (with new info, failures healed)."""
        await self.stop()
        if down_seconds > 0:
            await asyncio.sleep(down_seconds)
        if info is not None:
            self.info = info
        self.modes = {"health": "ok", "server_info": "ok"}
        self._release = asyncio.Event()
        await self.start()

    # --- handlers ---

    async def _answer(self, target: str, ok: web.Response) -> web.StreamResponse:
        self.requests[target] += 1
        mode = self.modes[target]
        if mode == "status":
            return web.json_response({"error": f"stub {target} failure"}, status=self.statuses[target])
        if mode == "hang":
            release = self._release
            await release.wait()
            return web.json_response({"error": "released"}, status=503)
        if mode == "malformed":
            return web.Response(body=b'{"max_total_num_tokens": 12', content_type="application/json")
        return ok

    async def _server_info(self, request: web.Request) -> web.StreamResponse:
        if self.legacy_only and request.path.endswith("/server_info") and not request.path.endswith("/get_server_info"):
            raise web.HTTPNotFound()
        return await self._answer("server_info", web.json_response(self.info))

    async def _health(self, _request: web.Request) -> web.StreamResponse:
        return await self._answer("health", web.Response(status=200))

    async def _ctl_info(self, request: web.Request) -> web.Response:
        self.set_info(await request.json())
        return web.json_response({"ok": True})

    async def _ctl_fail(self, request: web.Request) -> web.Response:
        body = await request.json()
        try:
            self.fail(body.get("target", ""), body.get("mode", ""), body.get("status"))
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"ok": True})

    async def _ctl_restart(self, request: web.Request) -> web.Response:
        body = await request.json()
        # Answer first, then restart: the restart tears down this very connection.
        self._restart_task = asyncio.get_running_loop().create_task(
            self.restart(body.get("info"), float(body.get("down_seconds", 0.2)))
        )
        return web.json_response({"ok": True})

    async def _ctl_state(self, _request: web.Request) -> web.Response:
        return web.json_response({"modes": self.modes, "requests": self.requests, "info": self.info})


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m tests.support.sglang_stub",
        description="SGLang-shaped /server_info + /health server for tests and demos",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--max-total-num-tokens", type=int, default=65_536)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--dp-size", type=int, default=1)
    p.add_argument("--enable-dp-attention", action="store_true")
    p.add_argument("--max-running-requests", type=int, default=256)
    p.add_argument("--model-path", default="stub/model")
    p.add_argument("--enable-hierarchical-cache", action="store_true")
    p.add_argument("--hicache-ratio", type=float, default=2.0)
    p.add_argument("--hicache-size", type=int, default=0)
    p.add_argument("--hicache-write-policy", default="write_through")
    p.add_argument("--hicache-storage-backend", default=None)
    p.add_argument("--hicache-host-total-tokens", type=int, default=None)
    p.add_argument("--legacy-only", action="store_true", help="serve only /get_server_info")
    p.add_argument("--ready-file", default="", help='write {"port": P} here once listening')
    return p.parse_args(argv)


async def _serve(args: argparse.Namespace) -> None:
    info = sglang_info(
        max_total_num_tokens=args.max_total_num_tokens,
        page_size=args.page_size,
        dp_size=args.dp_size,
        enable_dp_attention=args.enable_dp_attention,
        max_running_requests=args.max_running_requests,
        model_path=args.model_path,
        enable_hierarchical_cache=args.enable_hierarchical_cache,
        hicache_ratio=args.hicache_ratio,
        hicache_size=args.hicache_size,
        hicache_write_policy=args.hicache_write_policy,
        hicache_storage_backend=args.hicache_storage_backend,
        hicache_host_total_tokens=args.hicache_host_total_tokens,
    )
    stub = SglangStub(info, host=args.host, port=args.port, legacy_only=args.legacy_only)
    await stub.start()
    print(f"sglang_stub listening on {stub.url}", flush=True)
    if args.ready_file:
        with open(args.ready_file + ".tmp", "w") as fh:
            json.dump({"port": stub.port, "url": stub.url}, fh)
        import os

        os.replace(args.ready_file + ".tmp", args.ready_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await stub.stop()


def main(argv: list[str] | None = None) -> int:
    asyncio.run(_serve(_parse(sys.argv[1:] if argv is None else argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
