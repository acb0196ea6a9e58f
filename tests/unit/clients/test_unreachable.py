"""The SDK's BandmasterClient against a mutual-TLS server it cannot reach as configured: the UNAVAILABLE it
raises says why (an `Unreachable`, still an AioRpcError with code UNAVAILABLE)."""

from __future__ import annotations

import grpc
import pytest

from bandmaster.router.v1 import router_pb2 as pb
from bandmaster.router.v1 import router_pb2_grpc as pb_grpc
from clients import BandmasterClient, Unreachable
from services.common.auth.certs import issue, make_ca

CA, CA_KEY = make_ca()
SERVER_CERT, SERVER_KEY = issue(CA, CA_KEY, "router")
CLIENT_CERT, CLIENT_KEY = issue(CA, CA_KEY, "agent")


class _Router(pb_grpc.RouterServicer):
    async def Release(self, request, context):
        return pb.ReleaseResponse(released=True)

    async def Generate(self, request, context):
        yield pb.GenerateChunk(text="hi", finish_reason="stop")


@pytest.fixture
async def router():
    server = grpc.aio.server()
    pb_grpc.add_RouterServicer_to_server(_Router(), server)
    credentials = grpc.ssl_server_credentials(
        [(SERVER_KEY, SERVER_CERT)], root_certificates=CA, require_client_auth=True
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    yield f"127.0.0.1:{port}"
    await server.stop(0)


async def test_without_a_client_certificate_the_error_says_so(router):
    async with BandmasterClient(router, ca_pem=CA, timeout_s=5) as client:
        with pytest.raises(Unreachable) as info:
            await client.release("p")
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "requires a client certificate" in info.value.details()
    assert "cert_pem= and key_pem=" in info.value.reason


async def test_a_stream_fails_with_the_reason_too(router):
    async with BandmasterClient(router, timeout_s=5) as client:  # plaintext against TLS
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in client.program("p").complete("hi"):
                pass
    assert isinstance(info.value, Unreachable)
    assert "speaks TLS but this client dialed plaintext" in info.value.details()


async def test_with_the_client_certificate_the_call_works(router):
    async with BandmasterClient(router, ca_pem=CA, cert_pem=CLIENT_CERT, key_pem=CLIENT_KEY, timeout_s=5) as client:
        assert await client.release("p")
        chunks = [c async for c in client.program("q").complete("hi")]
    assert chunks[-1].finish_reason == "stop"


async def test_opaque_credentials_keep_grpcs_error(router):
    credentials = grpc.ssl_channel_credentials(CA)
    async with BandmasterClient(router, credentials=credentials, timeout_s=5) as client:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await client.release("p")
    assert not isinstance(info.value, Unreachable)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_credentials_and_pems_are_exclusive():
    with pytest.raises(ValueError):
        BandmasterClient("127.0.0.1:1", credentials=grpc.ssl_channel_credentials(CA), ca_pem=CA)
    with pytest.raises(ValueError):
        BandmasterClient("127.0.0.1:1", ca_pem=CA, cert_pem=CLIENT_CERT)
