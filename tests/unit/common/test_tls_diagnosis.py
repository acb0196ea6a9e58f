"""The TLS probe a client runs after a call failed UNAVAILABLE, against real local gRPC servers (plaintext,
TLS, mutual TLS) with certificates from the repo's own CA helper."""

from __future__ import annotations

import asyncio
import datetime
import socket

import grpc
import pytest
from grpc_health.v1 import health, health_pb2_grpc

from services.common.auth.certs import issue, make_ca
from services.common.outbound.tls_diagnosis import FlagNames, diagnose, split_address

CA, CA_KEY = make_ca()
SERVER_CERT, SERVER_KEY = issue(CA, CA_KEY, "server")
CLIENT_CERT, CLIENT_KEY = issue(CA, CA_KEY, "client")
OTHER_CA, OTHER_CA_KEY = make_ca("some other CA")
STRANGER_CERT, STRANGER_KEY = issue(OTHER_CA, OTHER_CA_KEY, "stranger")


async def _server(mode: str) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    if mode == "plaintext":
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        credentials = grpc.ssl_server_credentials(
            [(SERVER_KEY, SERVER_CERT)],
            root_certificates=CA if mode == "mtls" else None,
            require_client_auth=mode == "mtls",
        )
        port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    return server, f"127.0.0.1:{port}"


async def _diagnose(mode: str, **kwargs) -> str | None:
    server, address = await _server(mode)
    try:
        return await asyncio.to_thread(diagnose, address, **kwargs)
    finally:
        await server.stop(0)


async def test_mtls_server_and_a_client_without_a_certificate() -> None:
    text = await _diagnose("mtls", tls=True, ca_pem=CA)
    assert text is not None
    assert "requires a client certificate" in text and "--tls-cert and --tls-key" in text


async def test_mtls_server_and_a_certificate_from_another_ca() -> None:
    text = await _diagnose("mtls", tls=True, ca_pem=CA, cert_pem=STRANGER_CERT, key_pem=STRANGER_KEY)
    assert text is not None and "refused the client certificate" in text and "not signed by a CA" in text


async def test_mtls_server_and_an_expired_client_certificate() -> None:
    # Issued "a minute ago" for zero days: expired on arrival.
    cert, key = issue(CA, CA_KEY, "late", days=0)
    text = await _diagnose("mtls", tls=True, ca_pem=CA, cert_pem=cert, key_pem=key)
    assert text is not None and "expired on" in text


async def test_mtls_server_and_the_right_client_certificate_is_no_diagnosis() -> None:
    assert await _diagnose("mtls", tls=True, ca_pem=CA, cert_pem=CLIENT_CERT, key_pem=CLIENT_KEY) is None


async def test_server_certificate_not_trusted_by_the_ca_given() -> None:
    text = await _diagnose("tls", tls=True, ca_pem=OTHER_CA)
    assert text is not None and "not trusted by the CA you gave" in text and "--tls-ca" in text


async def test_server_certificate_not_trusted_by_the_system_roots() -> None:
    text = await _diagnose("tls", tls=True)
    assert text is not None and "system roots" in text


async def test_plaintext_server_dialed_with_tls() -> None:
    text = await _diagnose("plaintext", tls=True, ca_pem=CA, cert_pem=CLIENT_CERT, key_pem=CLIENT_KEY)
    assert text is not None and "speaks plaintext but this client dialed TLS" in text


@pytest.mark.parametrize("mode", ["tls", "mtls"])
async def test_tls_server_dialed_plaintext(mode: str) -> None:
    text = await _diagnose(mode, tls=False)
    assert text is not None and "speaks TLS but this client dialed plaintext" in text


async def test_plaintext_server_dialed_plaintext_is_no_diagnosis() -> None:
    assert await _diagnose("plaintext", tls=False) is None


async def test_the_advice_uses_the_callers_names() -> None:
    names = FlagNames(ca="ca_pem=", cert_and_key="cert_pem= and key_pem=")
    text = await _diagnose("mtls", tls=True, ca_pem=CA, names=names)
    assert text is not None and "cert_pem= and key_pem=" in text and "--tls" not in text


def test_nothing_listening() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    text = diagnose(f"127.0.0.1:{port}", tls=True, ca_pem=CA)
    assert text == f"nothing listens on 127.0.0.1:{port} (connection refused)"


def test_a_silent_server_is_bounded_by_the_timeout() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        started = datetime.datetime.now()
        text = diagnose(address, tls=True, ca_pem=CA, timeout_s=0.3)
        assert (datetime.datetime.now() - started).total_seconds() < 2
    assert text is not None and "within 0.3 s" in text


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:5", ("127.0.0.1", 5)),
        ("[::1]:7", ("::1", 7)),
        ("ipv4:10.0.0.1:9", ("10.0.0.1", 9)),
        ("dns:///localhost:3", ("localhost", 3)),
    ],
)
def test_split_address(address: str, expected: tuple[str, int]) -> None:
    assert split_address(address) == expected


def test_the_cli_keeps_a_diagnosis_so_a_live_view_does_not_probe_every_redraw(monkeypatch) -> None:
    import argparse

    from services.cli import endpoints

    class Unavailable(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.UNAVAILABLE

        def details(self) -> str:
            return "failed to connect"

    probes: list[str] = []

    def probe(address: str, **_: object) -> str:
        probes.append(address)
        return f"nothing listens on {address}"

    monkeypatch.setattr(endpoints, "diagnose", probe)
    monkeypatch.setattr(endpoints, "_diagnoses", {})
    args = argparse.Namespace(tls_ca="", tls_cert="", tls_key="")
    for _ in range(3):
        line = endpoints.rpc_error(Unavailable(), "127.0.0.1:1", args)
    assert line == "UNAVAILABLE: nothing listens on 127.0.0.1:1 (grpc: failed to connect)"
    endpoints.rpc_error(Unavailable(), "127.0.0.1:2", args)
    assert probes == ["127.0.0.1:1", "127.0.0.1:2"]


def test_expired_diagnoses_are_not_kept(monkeypatch):
    from services.cli import endpoints

    clock = [100.0]
    monkeypatch.setattr(endpoints.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(endpoints, "diagnose", lambda address, **_: f"nothing listens on {address}")
    monkeypatch.setattr(endpoints, "_diagnoses", {})
    for port in range(50):
        endpoints._diagnosis(f"127.0.0.1:{port}", None, None, None)
    clock[0] += endpoints.DIAGNOSIS_TTL_S
    endpoints._diagnosis("127.0.0.1:99", None, None, None)
    assert [entry[0] for entry in endpoints._diagnoses] == ["127.0.0.1:99"]
