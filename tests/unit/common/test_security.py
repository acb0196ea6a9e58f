"""Security settings, the role table, the token interceptor and the HTTP bearer guard.

The interceptor and TLS are exercised against a real `ServiceHost` on 127.0.0.1:0 with certificates
from the local CA (`services.common.auth.certs`), the HTTP guard against a real aiohttp server.
"""

import os
import stat

import aiohttp
import grpc
import pytest
from aiohttp import web
from aiohttp.test_utils import RawTestServer
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.auth.certs import ensure_local_pki, issue, make_ca
from services.common.auth.security import (
    OncePer,
    Role,
    SecurityFlags,
    Tokens,
    Verdict,
    authorize,
    bearer_guard,
    bearer_of,
    client_security,
    load_security,
    peer_host,
    refusal_reason,
    required_role,
)
from services.common.serve.grpc_server import ServiceHost
from services.common.settings.config import parse_settings, settings_of
from services.common.settings.errors import ConfigError

CONTROL = "c" * 20
DATA = "d" * 20
OTHER = "x" * 20


def load(argv=(), env=None):
    values = parse_settings(settings_of(SecurityFlags, prefix="X"), list(argv), env or {}, prog="x")
    return load_security(values, env or {})


def token_file(tmp_path, name, text, mode=0o600):
    path = tmp_path / name
    path.write_text(text)
    os.chmod(path, mode)
    return str(path)


# -- the role table and the decision ---------------------------------------------------------------


@pytest.mark.parametrize(
    "method, role",
    [
        ("/grpc.health.v1.Health/Check", Role.PUBLIC),
        ("/bandmaster.router.v1.Router/Generate", Role.DATA),
        ("/bandmaster.router.v1.Router/Release", Role.DATA),
        ("/bandmaster.capacity.v1.Capacity/RegisterWorker", Role.CONTROL),
        ("/bandmaster.scheduler.v1.Scheduler/Release", Role.CONTROL),
        ("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", Role.CONTROL),
    ],
)
def test_role_table(method, role):
    assert required_role(method) is role


C, D = Tokens([CONTROL]), Tokens([DATA])


@pytest.mark.parametrize(
    "role, presented, control, data, verdict",
    [
        (Role.PUBLIC, None, C, D, Verdict.ALLOW),
        (Role.CONTROL, None, None, D, Verdict.ALLOW),  # no control token configured: open
        (Role.CONTROL, None, C, D, Verdict.UNAUTHENTICATED),
        (Role.CONTROL, OTHER, C, D, Verdict.UNAUTHENTICATED),
        (Role.CONTROL, DATA, C, D, Verdict.PERMISSION_DENIED),  # roles are separate
        (Role.CONTROL, CONTROL, C, D, Verdict.ALLOW),
        (Role.DATA, None, C, None, Verdict.ALLOW),  # no data token configured: open
        (Role.DATA, None, C, D, Verdict.UNAUTHENTICATED),
        (Role.DATA, OTHER, C, D, Verdict.UNAUTHENTICATED),
        (Role.DATA, DATA, C, D, Verdict.ALLOW),
        (Role.DATA, CONTROL, C, D, Verdict.ALLOW),  # control is a superset
        (Role.DATA, DATA, None, D, Verdict.ALLOW),
        (Role.CONTROL, CONTROL[:-1], C, D, Verdict.UNAUTHENTICATED),
    ],
)
def test_authorize(role, presented, control, data, verdict):
    assert authorize(role, presented.encode() if presented else None, control, data) is verdict


@pytest.mark.parametrize(
    "header, token",
    [
        ("Bearer abc", b"abc"),
        ("bearer  abc ", b"abc"),
        ("BEARER abc", b"abc"),
        (None, None),
        ("", None),
        ("Basic abc", None),
        ("Bearer", None),
        ("Bearer ", None),
    ],
)
def test_bearer_of(header, token):
    assert bearer_of(header) == token


def test_tokens_never_in_a_repr(tmp_path):
    security = load(
        [
            "--control-token-file",
            token_file(tmp_path, "c", CONTROL + "\n"),
            "--data-token-file",
            token_file(tmp_path, "d", DATA),
        ]
    )
    assert CONTROL not in repr(security) and DATA not in repr(security)
    assert security.control_tokens.first == CONTROL


def test_several_tokens_per_file_for_rotation(tmp_path):
    security = load(["--control-token-file", token_file(tmp_path, "c", f"# rotation\n{CONTROL}\n{OTHER}\n")])
    assert security.control_tokens.matches(CONTROL.encode()) and security.control_tokens.matches(OTHER.encode())
    assert security.control_tokens.first == CONTROL


# -- settings parsing ---------------------------------------------------------------------------


def test_defaults_are_plaintext_without_reflection():
    security = load()
    assert not security.tls and security.control_tokens is None and security.data_tokens is None
    assert security.grpc_reflection is False
    assert security.describe() == "plaintext"


def test_env_sources(tmp_path):
    pki = ensure_local_pki(tmp_path / "pki", ["svc"])
    env = {
        "X_TLS_CERT": str(pki.cert("svc")),
        "X_TLS_KEY": str(pki.key("svc")),
        "X_TLS_CA": str(pki.ca),
        "BANDMASTER_CONTROL_TOKEN": CONTROL,
        "X_DATA_TOKEN_FILE": token_file(tmp_path, "d", DATA),
        "X_GRPC_REFLECTION": "true",
    }
    security = load(env=env)
    assert security.mutual_tls and security.grpc_reflection
    assert security.describe() == "mTLS, control token, data token, reflection"


@pytest.fixture
def pki(tmp_path):
    return ensure_local_pki(tmp_path / "pki", ["svc", "client"])


def test_invalid_combinations_name_the_rule(tmp_path, pki):
    cert, key, ca = str(pki.cert("svc")), str(pki.key("svc")), str(pki.ca)
    cases = [
        (["--tls-cert", cert], "tls_key", "go together"),
        (["--tls-key", key], "tls_cert", "go together"),
        (["--tls-ca", ca], "tls_ca", "needs --tls-cert"),
        (["--tls-cert", cert, "--tls-key", str(tmp_path / "missing")], "tls_key", "cannot read"),
        (["--tls-cert", cert, "--tls-key", str(pki.key("client"))], "tls_key", "matching --tls-cert"),
        (["--tls-cert", cert, "--tls-key", key, "--tls-ca", key], "tls_ca", "CA bundle"),
        (["--control-token-file", str(tmp_path / "missing")], "control_token_file", "cannot read"),
        (["--control-token-file", token_file(tmp_path, "e", "\n# nothing\n")], "control_token_file", "no token"),
        (["--control-token-file", token_file(tmp_path, "s", "short")], "control_token_file", "shorter"),
        (["--data-token-file", token_file(tmp_path, "sp", "a token with spaces")], "data_token_file", "ASCII"),
        (["--control-token-file", token_file(tmp_path, "w", CONTROL, 0o666)], "control_token_file", "writable"),
        (
            [
                "--control-token-file",
                token_file(tmp_path, "c", CONTROL),
                "--data-token-file",
                token_file(tmp_path, "d", CONTROL),
            ],
            "data_token_file",
            "must differ",
        ),
    ]
    for argv, field, rule in cases:
        with pytest.raises(ConfigError) as info:
            load(argv)
        assert info.value.field == field, argv
        assert rule in str(info.value), (argv, str(info.value))
        assert CONTROL not in str(info.value)


def test_token_in_file_and_env_is_ambiguous(tmp_path):
    with pytest.raises(ConfigError, match="not both"):
        load(["--control-token-file", token_file(tmp_path, "c", CONTROL)], {"BANDMASTER_CONTROL_TOKEN": OTHER})


def test_readable_token_file_is_a_warning_not_a_refusal(tmp_path):
    security = load(["--control-token-file", token_file(tmp_path, "c", CONTROL, 0o644)])
    assert security.control_tokens is not None
    assert any("readable by other users" in note for note in security.notes)


def test_local_pki_files_are_private(pki):
    for path in (pki.ca_key, pki.key("svc"), pki.control_token_file, pki.data_token_file):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
    assert stat.S_IMODE(os.stat(pki.directory).st_mode) == 0o700
    before = pki.control_token_file.read_text()
    again = ensure_local_pki(pki.directory, ["svc"])  # the CA and the tokens are reused
    assert again.control_token_file.read_text() == before
    assert pki.data_token_file.read_text() != before


# -- the gRPC server: mutual TLS and the token interceptor --------------------------------------


def _echo(request: bytes, context) -> bytes:
    return request


async def _serve(security):
    host = ServiceHost("test", listen="127.0.0.1:0", metrics_port=-1, shutdown_grace_seconds=0.2, security=security)
    handlers = {"Ping": grpc.unary_unary_rpc_method_handler(_echo)}
    host.server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler("test.v1.Control", handlers),
            grpc.method_handlers_generic_handler(
                "bandmaster.router.v1.Router", {"Release": grpc.unary_unary_rpc_method_handler(_echo)}
            ),
        ]
    )
    await host.start()
    return host


async def _call(channel, method, token=None):
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    return await channel.unary_unary(method)(b"hi", timeout=5, metadata=metadata)


async def test_mutual_tls_and_roles(tmp_path, pki):
    security = load(
        pki.tls_args("svc")
        + [
            "--control-token-file",
            token_file(tmp_path, "c", CONTROL),
            "--data-token-file",
            token_file(tmp_path, "d", DATA),
        ]
    )
    host = await _serve(security)
    try:
        client = client_security(tls_ca=str(pki.ca), tls_cert=str(pki.cert("client")), tls_key=str(pki.key("client")))
        async with client.channel(host.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)  # public: no token
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            for method, token, code in [
                ("/test.v1.Control/Ping", None, grpc.StatusCode.UNAUTHENTICATED),
                ("/test.v1.Control/Ping", OTHER, grpc.StatusCode.UNAUTHENTICATED),
                ("/test.v1.Control/Ping", DATA, grpc.StatusCode.PERMISSION_DENIED),
                ("/bandmaster.router.v1.Router/Release", None, grpc.StatusCode.UNAUTHENTICATED),
            ]:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await _call(channel, method, token)
                assert info.value.code() == code, (method, token)
                assert CONTROL not in (info.value.details() or "")
            assert await _call(channel, "/test.v1.Control/Ping", CONTROL) == b"hi"
            assert await _call(channel, "/bandmaster.router.v1.Router/Release", DATA) == b"hi"
        # A channel built from a config with a control token sends it on every call.
        dialer = client_security(
            tls_ca=str(pki.ca),
            tls_cert=str(pki.cert("client")),
            tls_key=str(pki.key("client")),
            control_token_file=token_file(tmp_path, "c2", CONTROL),
        )
        async with dialer.channel(host.address) as channel:
            assert await _call(channel, "/test.v1.Control/Ping") == b"hi"
        refused = host.registry.get_sample_value(
            "bandmaster_auth_refusals_total", {"interface": "grpc", "reason": "unauthenticated"}
        )
        assert refused == 3

        # No client certificate: the handshake is refused before any RPC.
        async with client_security(tls_ca=str(pki.ca)).channel(host.address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await _call(channel, "/test.v1.Control/Ping", CONTROL)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        # A certificate from another CA: refused too.
        other_ca, other_key = make_ca("another CA")
        cert, key = issue(other_ca, other_key, "intruder")
        (tmp_path / "i.pem").write_bytes(cert)
        (tmp_path / "i.key").write_bytes(key)
        intruder = client_security(
            tls_ca=str(pki.ca), tls_cert=str(tmp_path / "i.pem"), tls_key=str(tmp_path / "i.key")
        )
        async with intruder.channel(host.address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await _call(channel, "/test.v1.Control/Ping", CONTROL)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        # Plaintext against a TLS port: refused.
        async with grpc.aio.insecure_channel(host.address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await _call(channel, "/test.v1.Control/Ping", CONTROL)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await host.stop()


async def test_tokens_without_tls(tmp_path):
    host = await _serve(load(["--control-token-file", token_file(tmp_path, "c", CONTROL)]))
    try:
        async with grpc.aio.insecure_channel(host.address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await _call(channel, "/test.v1.Control/Ping")
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert await _call(channel, "/test.v1.Control/Ping", CONTROL) == b"hi"
            # No data token configured: the data plane is open.
            assert await _call(channel, "/bandmaster.router.v1.Router/Release") == b"hi"
    finally:
        await host.stop()


async def test_a_refused_call_says_what_was_wrong_and_is_logged_once_per_peer(tmp_path, caplog):
    host = await _serve(load(["--control-token-file", token_file(tmp_path, "c", CONTROL)]))
    caplog.set_level("WARNING", logger="services.common.auth.security")
    try:
        async with grpc.aio.insecure_channel(host.address) as channel:
            details = {}
            for name, metadata in [
                ("missing", None),
                ("not bearer", (("authorization", f"Basic {CONTROL}"),)),
                ("unknown", (("authorization", f"Bearer {OTHER}"),)),
                ("unknown again", (("authorization", f"Bearer {OTHER}"),)),
            ]:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await channel.unary_unary("/test.v1.Control/Ping")(b"hi", timeout=5, metadata=metadata)
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
                details[name] = info.value.details()
        assert details["missing"].startswith("missing authorization metadata")
        assert details["not bearer"].startswith("authorization metadata is not `Bearer <token>`")
        assert details["unknown"] == "bearer token not accepted: it is not the control token of this service"
        text = caplog.text
        assert OTHER not in text and CONTROL not in text and OTHER not in "".join(details.values())
        warnings = [r for r in caplog.records if r.levelname == "WARNING" and "refused" in r.getMessage()]
        # Three reasons, one line each: the second unknown-token call from the same peer is not logged again.
        assert len(warnings) == 3
        assert all("/test.v1.Control/Ping from ipv4:127.0.0.1:" in r.getMessage() for r in warnings)
    finally:
        await host.stop()


@pytest.mark.parametrize(
    ("role", "verdict", "authorization", "start"),
    [
        (Role.CONTROL, Verdict.UNAUTHENTICATED, None, "missing authorization metadata"),
        (Role.DATA, Verdict.UNAUTHENTICATED, None, "missing authorization metadata"),
        (Role.CONTROL, Verdict.UNAUTHENTICATED, "Bearer", "authorization metadata is not"),
        (Role.DATA, Verdict.UNAUTHENTICATED, f"Bearer {OTHER}", "bearer token not accepted: it is not the data or"),
        (Role.CONTROL, Verdict.PERMISSION_DENIED, f"Bearer {DATA}", "a data-plane token may not call control RPCs"),
    ],
)
def test_refusal_reason(role, verdict, authorization, start):
    reason = refusal_reason(role, verdict, authorization)
    assert reason.startswith(start)
    assert OTHER not in reason and DATA not in reason


def test_once_per_interval_per_key():
    now = [0.0]
    once = OncePer(60.0, lambda: now[0], max_keys=2)
    assert once("a") and not once("a") and once("b")
    now[0] = 59.0
    assert not once("a")
    assert not once("c")  # full, and nothing old enough to forget: quiet
    now[0] = 60.0
    assert once("a") and once("c")


@pytest.mark.parametrize(
    ("peer", "host"),
    [("ipv4:127.0.0.1:53012", "ipv4:127.0.0.1"), ("ipv6:[::1]:4", "ipv6:[::1]"), ("unix:/tmp/s", "unix:/tmp/s")],
)
def test_peer_host(peer, host):
    assert peer_host(peer) == host


# -- the HTTP bearer guard ----------------------------------------------------------------------


async def test_http_bearer_guard(caplog):
    async def handler(request):
        return web.json_response({"path": request.path})

    refusals = []
    guarded = bearer_guard(
        handler,
        Tokens([CONTROL]),
        Tokens([DATA]),
        headers={"Server": "bandmaster"},
        on_refusal=lambda interface, verdict: refusals.append((interface, verdict)),
        log_once=OncePer(60.0, lambda: 0.0),
    )
    caplog.set_level("WARNING", logger="services.common.auth.security")
    async with RawTestServer(guarded) as server, aiohttp.ClientSession() as session:
        url = str(server.make_url("/v1/models"))
        for headers, status, message in [
            ({}, 401, "missing Authorization header: send `Authorization: Bearer <token>`"),
            ({"Authorization": f"Bearer {OTHER}"}, 401, "bearer token not accepted"),
            ({"Authorization": f"Bearer {OTHER}"}, 401, "bearer token not accepted"),
            ({"Authorization": DATA}, 401, "Authorization header is not `Bearer <token>`"),
            ({"Authorization": f"Bearer {DATA}"}, 200, ""),
            ({"Authorization": f"Bearer {CONTROL}"}, 200, ""),
        ]:
            async with session.get(url, headers=headers) as response:
                assert response.status == status, headers
                body = await response.json()
                if status == 401:
                    assert body["error"]["message"].startswith(message)
                    assert OTHER not in body["error"]["message"] and DATA not in body["error"]["message"]
                    assert body["error"]["code"] == "invalid_api_key"
                    assert body["error"]["type"] == "invalid_request_error"
                    assert response.headers["WWW-Authenticate"].startswith("Bearer")
                    assert response.headers["Server"] == "bandmaster"
        async with session.get(server.make_url("/health")) as response:  # probes need no token
            assert response.status == 200
    assert refusals == [("http", Verdict.UNAUTHENTICATED)] * 4
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    # One line per peer and reason: the second unknown token is not logged again; never the token.
    assert len(warnings) == 3 and all(w.startswith("refused GET /v1/models from 127.0.0.1: ") for w in warnings)
    assert not any(OTHER in w or DATA in w for w in warnings)


def test_http_guard_off_without_tokens():
    async def handler(request):
        return web.Response()

    assert bearer_guard(handler, None, None) is handler
