"""A small client of the router's gRPC API, and session headers for OpenAI clients.

    async with BandmasterClient("127.0.0.1:50053") as client:
        async with client.program("agent-42") as p:          # Release on exit
            async for chunk in p.chat([{"role": "user", "content": "hi"}], max_tokens=64):
                print(chunk.text, end="")

    openai = AsyncOpenAI(base_url=..., default_headers=session_headers("agent-42"))

A secure router (docs/security.md) wants the CA that signed its certificate, a client certificate and key
(mutual TLS: without them the connection is refused before any call) and the data-plane token:

    BandmasterClient(address, ca_pem=ca, cert_pem=client_cert, key_pem=client_key, token=data_token)

A call that fails UNAVAILABLE raises `Unreachable` (an `AioRpcError`, still UNAVAILABLE) whose details say
why when a TLS probe of the address finds it (`services.common.outbound.tls_diagnosis`): no client certificate, a
certificate the server refused, a server certificate the CA does not trust, TLS against plaintext or the
reverse. The probe runs only after the failure (at most 2 s). With opaque `credentials=` instead of the PEMs
it cannot know what was dialed, and the error is grpc's own.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import AsyncIterator, Iterable, Mapping

import grpc

from bandmaster.router.v1 import router_pb2 as pb
from bandmaster.router.v1 import router_pb2_grpc as pb_grpc
from services.common.outbound.tls_diagnosis import FlagNames, diagnose

SESSION_HEADER = "X-Dynamo-Session-ID"
PARENT_HEADER = "X-Dynamo-Parent-Session-ID"
FINAL_HEADER = "X-Dynamo-Session-Final"


def session_headers(session_id: str, *, parent_session_id: str | None = None, final: bool = False) -> dict[str, str]:
    """Headers that make an OpenAI request one turn of program `session_id` (pass as default_headers or
    extra_headers). `final=True` marks the terminal request: the router releases the program."""
    headers = {SESSION_HEADER: session_id}
    if parent_session_id:
        headers[PARENT_HEADER] = parent_session_id
    if final:
        headers[FINAL_HEADER] = "true"
    return headers


class GenerateError(Exception):
    """The stream ended with finish_reason "error" (the worker failed after the first token)."""

    def __init__(self, message: str, chunk: pb.GenerateChunk) -> None:
        super().__init__(message)
        self.chunk = chunk


class Unreachable(grpc.aio.AioRpcError):
    """UNAVAILABLE, with `reason`: what a TLS probe of the address found wrong (None: nothing found)."""

    def __init__(self, original: grpc.aio.AioRpcError, reason: str) -> None:
        super().__init__(
            original.code(),
            original.initial_metadata(),
            original.trailing_metadata(),
            details=f"{reason} (grpc: {original.details()})",
            debug_error_string=original.debug_error_string(),
        )
        self.reason = reason


SDK_NAMES = FlagNames(ca="ca_pem=", cert_and_key="cert_pem= and key_pem=")


class Program:
    """One agent program: every call is a turn with this session id; `release()` ends it."""

    def __init__(self, client: "BandmasterClient", session_id: str, parent_session_id: str = "") -> None:
        self.client = client
        self.session_id = session_id
        self.parent_session_id = parent_session_id
        self.released = False

    async def chat(self, messages: Iterable[Mapping[str, str]], **sampling) -> AsyncIterator[pb.GenerateChunk]:
        chat = pb.ChatMessages(
            messages=[pb.ChatMessage(role=m["role"], content=m.get("content") or "") for m in messages]
        )
        async for chunk in self.client.generate(self._request(chat=chat, **sampling)):
            yield chunk

    async def complete(self, prompt: str, **sampling) -> AsyncIterator[pb.GenerateChunk]:
        async for chunk in self.client.generate(self._request(prompt=prompt, **sampling)):
            yield chunk

    def _request(
        self,
        *,
        model: str = "",
        max_tokens: int = 0,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: Iterable[str] = (),
        **input_,
    ) -> pb.GenerateRequest:
        sampling = pb.SamplingParams(max_tokens=max_tokens, stop=list(stop))
        if temperature is not None:
            sampling.temperature = temperature
        if top_p is not None:
            sampling.top_p = top_p
        return pb.GenerateRequest(
            session_id=self.session_id,
            parent_session_id=self.parent_session_id,
            model=model,
            sampling=sampling,
            request_id=uuid.uuid4().hex,
            **input_,
        )

    async def release(self) -> bool:
        if self.released:
            return False
        self.released = True
        return await self.client.release(self.session_id)

    async def __aenter__(self) -> "Program":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.release()


class BandmasterClient:
    def __init__(
        self,
        address: str,
        *,
        timeout_s: float | None = None,
        metadata: Mapping[str, str] | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        token: str | None = None,
        ca_pem: bytes | None = None,
        cert_pem: bytes | None = None,
        key_pem: bytes | None = None,
    ) -> None:
        """TLS: `ca_pem` (the CA that signed the server's certificate; None = system roots) and, under mutual
        TLS, `cert_pem` and `key_pem`; or ready-made `credentials` (then no diagnosis of an UNAVAILABLE)."""
        if credentials is not None and (ca_pem or cert_pem or key_pem):
            raise ValueError("give credentials= or the PEMs (ca_pem=, cert_pem=, key_pem=), not both")
        if bool(cert_pem) != bool(key_pem):
            raise ValueError("cert_pem= and key_pem= go together")
        self._pems = (ca_pem, cert_pem, key_pem)
        self._tls_from_pems = bool(ca_pem or cert_pem)
        if credentials is None and self._tls_from_pems:
            credentials = grpc.ssl_channel_credentials(ca_pem, key_pem, cert_pem)
        self._opaque_credentials = credentials is not None and not self._tls_from_pems
        self.address = address
        self.timeout_s = timeout_s
        self.metadata = tuple((metadata or {}).items())
        if token:
            self.metadata += (("authorization", f"Bearer {token}"),)
        self._credentials = credentials
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.RouterStub | None = None

    async def __aenter__(self) -> "BandmasterClient":
        self._channel = (
            grpc.aio.secure_channel(self.address, self._credentials)
            if self._credentials is not None
            else grpc.aio.insecure_channel(self.address)
        )
        self._stub = pb_grpc.RouterStub(self._channel)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    @property
    def stub(self) -> pb_grpc.RouterStub:
        if self._stub is None:
            raise RuntimeError("use `async with BandmasterClient(...)`")
        return self._stub

    def program(self, session_id: str | None = None, *, parent_session_id: str = "") -> Program:
        return Program(self, session_id or uuid.uuid4().hex, parent_session_id)

    async def generate(self, request: pb.GenerateRequest) -> AsyncIterator[pb.GenerateChunk]:
        """Stream one turn; raises GenerateError when the stream ends with an error, grpc.aio.AioRpcError
        when the router refuses the turn."""
        call = self.stub.Generate(request, timeout=self.timeout_s, metadata=self.metadata)
        try:
            async for chunk in call:
                if chunk.finish_reason == "error":
                    raise GenerateError(chunk.error, chunk)
                yield chunk
        except grpc.aio.AioRpcError as exc:
            explained = await self.explained(exc)
            if explained is exc:
                raise
            raise explained from exc
        finally:
            call.cancel()

    async def release(self, session_id: str) -> bool:
        try:
            answer = await self.stub.Release(
                pb.ReleaseRequest(session_id=session_id), timeout=self.timeout_s or 10, metadata=self.metadata
            )
        except grpc.aio.AioRpcError as exc:
            explained = await self.explained(exc)
            if explained is exc:
                raise
            raise explained from exc
        return answer.released

    async def explained(self, exc: grpc.aio.AioRpcError) -> grpc.aio.AioRpcError:
        """`exc`, or for UNAVAILABLE an `Unreachable` saying why when a TLS probe of the address finds it."""
        if exc.code() is not grpc.StatusCode.UNAVAILABLE or self._opaque_credentials:
            return exc
        ca, cert, key = self._pems
        reason = await asyncio.to_thread(
            diagnose, self.address, tls=self._tls_from_pems, ca_pem=ca, cert_pem=cert, key_pem=key, names=SDK_NAMES
        )
        return Unreachable(exc, reason) if reason else exc
