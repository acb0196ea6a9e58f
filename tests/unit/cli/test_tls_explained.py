"""`bandmaster programs`, `plan` and `status` against a TLS server they cannot reach as configured: one line that
says why (a TLS probe run after the UNAVAILABLE), exit 1, no traceback."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2_grpc

from services.cli import main
from services.common.auth.certs import ensure_local_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return ensure_local_pki(tmp_path_factory.mktemp("pki"), ["server", "client"])


@pytest.fixture(scope="module")
def mtls_server(pki):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    credentials = grpc.ssl_server_credentials(
        [(pki.key("server").read_bytes(), pki.cert("server").read_bytes())],
        root_certificates=pki.ca.read_bytes(),
        require_client_auth=True,
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(0)


@pytest.mark.parametrize(
    ("command", "flag"),
    [("programs", "--scheduler-addr"), ("plan", "--planner-addr")],
)
def test_no_client_certificate_is_explained(command, flag, mtls_server, pki, capsys):
    code = main([command, flag, mtls_server, "--tls-ca", str(pki.ca), "--timeout-seconds", "3"])
    err = capsys.readouterr().err
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert f"bandmaster {command}: {mtls_server}: UNAVAILABLE: the server requires a client certificate" in lines[0]
    assert "--tls-cert and --tls-key" in lines[0]


def test_plaintext_client_against_a_tls_server_is_explained(mtls_server, capsys):
    assert main(["programs", "--scheduler-addr", mtls_server, "--timeout-seconds", "3"]) == 1
    assert "the server speaks TLS but this client dialed plaintext: pass --tls-ca" in capsys.readouterr().err


def test_status_names_the_cause_for_each_service(mtls_server, pki, capsys):
    addresses = ["--capacity-addr", mtls_server, "--scheduler-addr", mtls_server, "--planner-addr", mtls_server]
    code = main(["status", "--once", *addresses, "--tls-ca", str(pki.ca), "--timeout-seconds", "3"])
    captured = capsys.readouterr()
    assert code == 1
    assert "requires a client certificate" in captured.out + captured.err
    assert "Traceback" not in captured.err
