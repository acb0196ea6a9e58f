"""The batch service's OpenAI Batch API over HTTP (aiohttp), backed by the durable registry.

    POST   /v1/files                  multipart {file, purpose="batch", expires_after[anchor|seconds]?} -> file
    GET    /v1/files?purpose=&limit=&order=&after=
                                      {object: "list", data, first_id, last_id, has_more}
    GET    /v1/files/{id}             file object (with `expires_at`)
    DELETE /v1/files/{id}             {id, object: "file", deleted: true}; 409 for the input of a running batch
    GET    /v1/files/{id}/content     input, output or error JSONL
    POST   /v1/batches                {input_file_id, endpoint, completion_window, metadata?,
                                       output_expires_after?} -> batch
    GET    /v1/batches?after=&limit=  {object: "list", data, first_id, last_id, has_more}, newest first
    GET  /v1/batches/{id}             batch
    POST /v1/batches/{id}/cancel      batch (idempotent)
    GET  /health

Errors are OpenAI-style bodies {"error": {message, type, param, code}} built by the one builder
(services/common/web/openai_errors.py `error_body`); every domain error maps
to its HTTP status in `_error_response` and nowhere else.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Awaitable, Callable

from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError

from services.batch.adapters.registry import Conflict, FileInUse, NotFound, Registry
from services.batch.core.batch_api import (
    BatchInputError,
    check_endpoint,
    check_id,
    parse_batch_input,
    parse_completion_window,
)
from services.batch.core.expiry import parse_expires_after
from services.batch.core.listing import page, parse_page_query
from services.common.auth.security import SecurityConfig, bearer_guard
from services.common.clock import Clock
from services.common.serve.ports import binding
from services.common.web.json_body import MAX_JSON_DEPTH, JsonTooDeep, loads_bounded
from services.common.web.openai_errors import error_body

log = logging.getLogger("services.batch.http")
MAX_LIST_LIMIT = 100
"""`GET /v1/batches`: OpenAI's bound on `limit` (default 20)."""
MAX_FILES_LIMIT = 10_000
"""`GET /v1/files`: OpenAI's bound on `limit` (and its default)."""


def _error_response(exc: Exception) -> web.Response:
    """The one mapping from domain errors to HTTP statuses."""
    if isinstance(exc, BatchInputError):
        body = error_body(exc.message, code=exc.code, param=exc.param)
        if exc.line is not None:
            body["error"]["line"] = exc.line
        return web.json_response(body, status=exc.status)
    if isinstance(exc, NotFound):
        return web.json_response(error_body(f"No such object: {exc.args[0]}", code="not_found"), status=404)
    if isinstance(exc, FileInUse):
        return web.json_response(error_body(str(exc), code="file_in_use", param="file_id"), status=409)
    if isinstance(exc, Conflict):
        return web.json_response(error_body(str(exc), code="conflict"), status=400)
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return web.json_response(error_body("request body too large", code="file_too_large", param="file"), status=413)
    if isinstance(exc, web.HTTPException):
        # A 405 keeps its Allow header (RFC 9110 requires it).
        return web.json_response(
            error_body(exc.reason or "error", code=str(exc.status)),
            status=exc.status,
            headers={k: v for k, v in exc.headers.items() if k == "Allow"},
        )
    if isinstance(exc, (web.RequestPayloadError, ConnectionResetError)):
        # A body that breaks its Content-Encoding or framing, or a client gone mid-body: the client's doing.
        # The connection closes (the rest of such a body cannot be read).
        log.debug("request body not read: %s", exc.__class__.__name__)
        response = web.json_response(
            error_body("the body does not match its Content-Encoding or framing", code="malformed_body"), status=400
        )
        response.force_close()
        return response
    log.exception("batch API error", exc_info=exc)
    return web.json_response(error_body("internal error", type_="server_error"), status=500)


@web.middleware
async def _errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    try:
        return await handler(request)
    except (
        BatchInputError,
        NotFound,
        Conflict,
        web.HTTPException,
        web.RequestPayloadError,
        ConnectionResetError,
    ) as exc:
        return _error_response(exc)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        return _error_response(exc)


class BatchApi:
    def __init__(
        self,
        registry: Registry,
        clock: Clock,
        *,
        max_requests: int,
        max_file_bytes: int,
        pool_id: str = "default",
        on_change: Callable[[], None] = lambda: None,
        on_delete: Callable[[dict], None] = lambda deleted: None,
        security: SecurityConfig | None = None,
    ) -> None:
        self.registry = registry
        self.clock = clock
        self.max_requests = max_requests
        self.max_file_bytes = max_file_bytes
        self.pool_id = pool_id
        self.on_change = on_change
        self.on_delete = on_delete
        self.security = security or SecurityConfig()
        control, data = self.security.control_tokens, self.security.data_tokens

        @web.middleware
        async def _auth(request: web.Request, handler):
            # The Batch API is data plane, like the router's OpenAI API: a data (or control) token
            # when one is configured; /health stays public.
            return await bearer_guard(handler, control, data)(request)

        middlewares = [_auth, _errors] if control is not None or data is not None else [_errors]
        self.app = web.Application(client_max_size=max_file_bytes + 1024 * 1024, middlewares=middlewares)
        r = self.app.router
        r.add_post("/v1/files", self.create_file)
        r.add_get("/v1/files", self.list_files)
        r.add_get("/v1/files/{id}", self.get_file)
        r.add_delete("/v1/files/{id}", self.delete_file)
        r.add_get("/v1/files/{id}/content", self.file_content)
        r.add_post("/v1/batches", self.create_batch)
        r.add_get("/v1/batches", self.list_batches)
        r.add_get("/v1/batches/{id}", self.get_batch)
        r.add_post("/v1/batches/{id}/cancel", self.cancel_batch)
        r.add_get("/health", self.health)
        self._runner: web.AppRunner | None = None
        self.port = 0

    def _now(self) -> int:
        return int(self.clock.wall())

    async def start(self, host: str, port: int) -> None:
        self._runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, ssl_context=self.security.http_ssl_context())
        with binding(host, port, "batch service Batch API HTTP", "--http-listen"):
            await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def create_file(self, request: web.Request) -> web.Response:
        if not request.content_type.startswith("multipart/"):
            raise BatchInputError("expected multipart/form-data with fields 'file' and 'purpose'")
        purpose: str | None = None
        data: bytes | None = None
        filename = "batch.jsonl"
        expires_after: dict[str, str] = {}
        try:
            reader = await request.multipart()
            while True:
                part = await reader.next()
                if part is None:
                    break
                if not isinstance(part, BodyPartReader):
                    raise BatchInputError("nested multipart parts are not supported")
                if part.name == "purpose":
                    purpose = (await part.text()).strip()
                elif part.name in ("expires_after[anchor]", "expires_after[seconds]"):
                    # The official client sends the object as bracketed form fields.
                    expires_after[part.name[len("expires_after[") : -1]] = (await part.text()).strip()
                elif part.name == "file":
                    filename = part.filename or filename
                    chunks, size = [], 0
                    while chunk := await part.read_chunk(1 << 16):
                        size += len(chunk)
                        if size > self.max_file_bytes:
                            raise BatchInputError(
                                f"file is larger than {self.max_file_bytes} bytes",
                                status=413,
                                code="file_too_large",
                                param="file",
                            )
                        chunks.append(chunk)
                    data = b"".join(chunks)
        except BatchInputError:
            raise
        except (ValueError, LookupError, HttpProcessingError) as exc:
            # No boundary, broken framing or part headers, a purpose in an unknown charset or not in its charset.
            raise BatchInputError(f"malformed multipart/form-data body ({exc.__class__.__name__})") from None
        if purpose != "batch":
            raise BatchInputError(f"purpose {purpose!r} is not supported (only 'batch')", param="purpose")
        if data is None:
            raise BatchInputError("a 'file' field is required", param="file")
        expires_after_s = parse_expires_after(expires_after or None)
        # Parsing a large file is CPU work: off the event loop. Nothing is stored unless it all parses.
        lines = await asyncio.to_thread(
            parse_batch_input, data, max_requests=self.max_requests, max_file_bytes=self.max_file_bytes
        )
        obj = self.registry.add_input_file(filename, data, lines, self._now(), expires_after_s)
        log.info("file %s: %d requests, %d bytes", obj["id"], len(lines), len(data))
        return web.json_response(obj)

    async def list_files(self, request: web.Request) -> web.Response:
        query = parse_page_query(
            request.query,
            default_limit=MAX_FILES_LIMIT,
            max_limit=MAX_FILES_LIMIT,
            orders=("desc", "asc"),
            with_purpose=True,
        )
        try:
            items = self.registry.list_files(query)
        except NotFound:
            raise BatchInputError(f"after: no file {query.after}", param="after") from None
        return web.json_response(page(items, query.limit))

    async def get_file(self, request: web.Request) -> web.Response:
        return web.json_response(self.registry.get_file(_path_id(request)))

    async def delete_file(self, request: web.Request) -> web.Response:
        deleted = self.registry.delete_file(_path_id(request))
        log.info("file %s deleted (%s, %d bytes)", deleted["id"], deleted["kind"], deleted["bytes"])
        self.on_delete(deleted)
        return web.json_response({"id": deleted["id"], "object": "file", "deleted": True})

    async def file_content(self, request: web.Request) -> web.Response:
        data = self.registry.file_content(_path_id(request))
        return web.Response(body=data, content_type="application/jsonl")

    async def create_batch(self, request: web.Request) -> web.Response:
        try:
            body = loads_bounded(await request.text())
        except JsonTooDeep:
            raise BatchInputError(f"the body is nested deeper than {MAX_JSON_DEPTH} levels") from None
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise BatchInputError("the body must be a JSON object") from None
        if not isinstance(body, dict):
            raise BatchInputError("the body must be a JSON object")
        file_id = body.get("input_file_id")
        if not isinstance(file_id, str) or not file_id:
            raise BatchInputError("input_file_id is required", param="input_file_id")
        _checked(file_id, "input_file_id")
        window_s = parse_completion_window(body.get("completion_window"))
        metadata = body.get("metadata")
        if metadata is not None and (
            not isinstance(metadata, dict)
            or len(metadata) > 16
            or not all(
                isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
                for k, v in metadata.items()
            )
        ):
            raise BatchInputError(
                "metadata must map at most 16 string keys (<= 64 chars) to strings (<= 512 chars)", param="metadata"
            )
        output_expires_s = parse_expires_after(body.get("output_expires_after"), "output_expires_after")
        try:
            urls = self.registry.input_urls(file_id)
        except NotFound:
            raise BatchInputError(
                f"input file {file_id} does not exist", param="input_file_id", code="not_found", status=404
            ) from None
        endpoint = check_endpoint(body.get("endpoint"), urls)
        batch = self.registry.create_batch(
            file_id,
            endpoint,
            body["completion_window"].strip(),
            window_s,
            metadata,
            self._now(),
            self.pool_id,
            output_expires_s,
        )
        log.info(
            "batch %s: %d requests to %s within %s",
            batch["id"],
            batch["request_counts"]["total"],
            endpoint,
            batch["completion_window"],
        )
        self.on_change()
        return web.json_response(_public(batch))

    async def list_batches(self, request: web.Request) -> web.Response:
        query = parse_page_query(request.query, default_limit=20, max_limit=MAX_LIST_LIMIT)
        try:
            items = self.registry.list_batches(query.after, query.limit)
        except NotFound:
            raise BatchInputError(f"after: no batch {query.after}", param="after") from None
        listing = page(items, query.limit)
        listing["data"] = [_public(b) for b in listing["data"]]
        return web.json_response(listing)

    async def get_batch(self, request: web.Request) -> web.Response:
        return web.json_response(_public(self.registry.get_batch(_path_id(request))))

    async def cancel_batch(self, request: web.Request) -> web.Response:
        batch = self.registry.cancel(_path_id(request), self._now())
        self.on_change()
        return web.json_response(_public(batch))


def _checked(value: str, param: str) -> str:
    try:
        return check_id(value, param)
    except ValueError as exc:
        raise BatchInputError(str(exc), param=param) from None


def _path_id(request: web.Request) -> str:
    return _checked(request.match_info["id"], "id")


def _public(batch: dict) -> dict:
    return {k: v for k, v in batch.items() if k not in ("pool_id", "dispatched")}
