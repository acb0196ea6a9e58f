"""The whole stack as `bandmaster up --secure` starts it (simworker, capacity, scheduler, router as real
processes, mutual TLS on every gRPC port, HTTPS and bearer tokens): what a client with the right
credentials gets, and that everything else is refused.
"""

import ssl
import urllib.error
import urllib.request

import grpc
import openai
import pytest

from bandmaster.capacity.v1 import capacity_pb2, capacity_pb2_grpc
from bandmaster.router.v1 import router_pb2, router_pb2_grpc
from bandmaster.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.cli import main as cli_main
from services.cli.up import connect_help
from services.common.auth.security import client_security
from services.launcher.cluster import ClusterConfig, start_cluster
from tests.support.eventually import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    state = tmp_path_factory.mktemp("secure-cluster")
    running = start_cluster(
        ClusterConfig(workers=1, worker_kv_tokens=8192, worker_speedup=20.0, http_port=0, state_dir=state, secure=True)
    )
    try:
        pki = running.pki
        context = ssl.create_default_context(cafile=str(pki.ca))
        wait_until(
            lambda: _healthy(running.http_url + "/health", context),
            timeout_s=30,
            interval_s=0.1,
            message="the router never saw a healthy worker",
        )
        yield running
    finally:
        running.stop()


def _healthy(url: str, context: ssl.SSLContext | None) -> bool:
    """GET /health (it needs no token) answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as response:
            return response.status == 200
    except urllib.error.HTTPError:
        return False


def _token(path) -> str:
    return path.read_text().strip()


def _client(cluster, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=cluster.http_url + "/v1",
        api_key=api_key,
        max_retries=0,
        http_client=openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=str(cluster.pki.ca))),
    )


def test_openai_client_with_the_data_token_gets_a_completion(cluster):
    reply = _client(cluster, _token(cluster.pki.data_token_file)).chat.completions.create(
        model="bandmaster-sim",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=8,
        extra_headers={"X-Dynamo-Session-ID": "secure-program"},
    )
    assert reply.choices[0].message.content
    assert reply.usage.completion_tokens > 0


def test_a_wrong_token_is_401(cluster):
    with pytest.raises(openai.AuthenticationError) as info:
        _client(cluster, "not-the-token-0123456789").chat.completions.create(
            model="bandmaster-sim", messages=[{"role": "user", "content": "hello"}], max_tokens=8
        )
    assert info.value.status_code == 401
    assert info.value.body["code"] == "invalid_api_key"


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Basic dXNlcjpwYXNz"}])
def test_no_bearer_token_is_401(cluster, headers):
    request = urllib.request.Request(
        cluster.http_url + "/v1/chat/completions",
        method="POST",
        headers=headers,
        data=b'{"model": "bandmaster-sim", "messages": []}',
    )
    context = ssl.create_default_context(cafile=str(cluster.pki.ca))
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=5, context=context)
    assert info.value.code == 401
    assert info.value.headers["WWW-Authenticate"].startswith("Bearer")
    assert b"invalid_api_key" in info.value.read()


def test_plain_http_is_not_served(cluster):
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        _healthy(cluster.http_url.replace("https://", "http://") + "/health", None)


def _channel(cluster, *, certificate: bool = True) -> grpc.aio.Channel:
    pki = cluster.pki
    if certificate:
        security = client_security(tls_ca=str(pki.ca), tls_cert=str(pki.cert("client")), tls_key=str(pki.key("client")))
    else:
        security = client_security(tls_ca=str(pki.ca))
    return security.channel(cluster.capacity.endpoint)


def _bearer(path) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {_token(path)}"),)


def _register(url: str) -> capacity_pb2.RegisterWorkerRequest:
    return capacity_pb2.RegisterWorkerRequest(url=url, worker_id="intruder")


async def test_grpc_roles_over_mutual_tls(cluster):
    pki = cluster.pki
    fake = _register("http://127.0.0.1:9")
    # No client certificate: the TLS handshake is refused before any RPC.
    async with _channel(cluster, certificate=False) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await capacity_pb2_grpc.CapacityStub(channel).RegisterWorker(
                fake, timeout=5, metadata=_bearer(pki.control_token_file)
            )
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    # Plaintext: refused too.
    async with grpc.aio.insecure_channel(cluster.capacity.endpoint) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await capacity_pb2_grpc.CapacityStub(channel).ListWorkers(capacity_pb2.ListWorkersRequest(), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE

    # What a refused call is told: what was wrong, never the token.
    why = {
        (grpc.StatusCode.UNAUTHENTICATED, False): "missing authorization metadata",
        (grpc.StatusCode.UNAUTHENTICATED, True): "bearer token not accepted",
        (grpc.StatusCode.PERMISSION_DENIED, True): "a data-plane token may not call control RPCs",
    }
    async with _channel(cluster) as channel:
        capacity = capacity_pb2_grpc.CapacityStub(channel)
        for metadata, code in [
            ((), grpc.StatusCode.UNAUTHENTICATED),
            ((("authorization", "Bearer wrong-token-0123456789"),), grpc.StatusCode.UNAUTHENTICATED),
            (_bearer(pki.data_token_file), grpc.StatusCode.PERMISSION_DENIED),
        ]:
            for call, request in [
                (capacity.RegisterWorker, fake),
                (capacity.DeregisterWorker, capacity_pb2.DeregisterWorkerRequest(worker_id="x")),
                (capacity.ListWorkers, capacity_pb2.ListWorkersRequest()),
            ]:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call(request, timeout=5, metadata=metadata)
                assert info.value.code() == code, (call, metadata)
                assert info.value.details().startswith(why[code, bool(metadata)]), info.value.details()
        # The control token may: register a worker, then take it out again.
        answer = await capacity.RegisterWorker(fake, timeout=5, metadata=_bearer(pki.control_token_file))
        assert answer.worker.worker_id == "intruder"
        removed = await capacity.DeregisterWorker(
            capacity_pb2.DeregisterWorkerRequest(worker_id="intruder"),
            timeout=5,
            metadata=_bearer(pki.control_token_file),
        )
        assert removed.removed

    # The scheduler: a data-plane client may not release a program there.
    scheduler_channel = client_security(
        tls_ca=str(pki.ca), tls_cert=str(pki.cert("client")), tls_key=str(pki.key("client"))
    ).channel(cluster.scheduler.endpoint)
    async with scheduler_channel as channel:
        scheduler = scheduler_pb2_grpc.SchedulerStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await scheduler.ListPrograms(scheduler_pb2.ListProgramsRequest(), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert info.value.details().startswith("missing authorization metadata"), info.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await scheduler.Release(
                scheduler_pb2.ReleaseRequest(session_id="secure-program"),
                timeout=5,
                metadata=_bearer(pki.data_token_file),
            )
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # The router admitted the first test's turn through the scheduler (mTLS + its control token),
        # rather than failing open.
        program = await scheduler.GetProgram(
            scheduler_pb2.GetProgramRequest(session_id="secure-program"),
            timeout=5,
            metadata=_bearer(pki.control_token_file),
        )
        assert program.turns >= 1

    # The router's gRPC data plane takes the data token (and nothing less).
    router_channel = client_security(
        tls_ca=str(pki.ca), tls_cert=str(pki.cert("client")), tls_key=str(pki.key("client"))
    ).channel(cluster.router.endpoint)
    async with router_channel as channel:
        router = router_pb2_grpc.RouterStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await router.Release(router_pb2.ReleaseRequest(session_id="secure-program"), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert info.value.details().startswith("missing authorization metadata: send `authorization: Bearer <token>`")
        assert "the data or control token" in info.value.details()
        await router.Release(
            router_pb2.ReleaseRequest(session_id="secure-program"), timeout=5, metadata=_bearer(pki.data_token_file)
        )


def test_programs_cli_over_mutual_tls(cluster, capsys):
    pki = cluster.pki
    base = [
        "programs",
        "--scheduler-addr",
        cluster.scheduler.endpoint,
        "--tls-ca",
        str(pki.ca),
        "--tls-cert",
        str(pki.cert("client")),
        "--tls-key",
        str(pki.key("client")),
    ]
    assert cli_main(base) == 1
    assert "UNAUTHENTICATED" in capsys.readouterr().err
    assert cli_main([*base, "--control-token-file", str(pki.control_token_file)]) == 0


def test_the_cli_without_the_client_certificate_says_why(cluster, capsys):
    pki = cluster.pki
    address = cluster.scheduler.endpoint
    base = ["--scheduler-addr", address, "--control-token-file", str(pki.control_token_file)]
    assert cli_main(["programs", *base, "--tls-ca", str(pki.ca)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"bandmaster programs: {address}: UNAVAILABLE: the server requires a client certificate" in err
    assert cli_main(["programs", *base]) == 1
    assert "the server speaks TLS but this client dialed plaintext" in capsys.readouterr().err
    others = ["--capacity-addr", cluster.capacity.endpoint, "--planner-addr", address]  # no default ports
    assert cli_main(["status", "--once", *base, *others, "--tls-ca", str(pki.ca), "--timeout-seconds", "3"]) == 1
    captured = capsys.readouterr()
    assert f"{address}: UNAVAILABLE: the server requires a client certificate" in captured.out + captured.err


async def test_the_sdk_without_the_client_certificate_says_why(cluster):
    from clients import BandmasterClient, Unreachable

    pki = cluster.pki
    async with BandmasterClient(cluster.router.endpoint, ca_pem=pki.ca.read_bytes(), timeout_s=5) as client:
        with pytest.raises(Unreachable) as info:
            await client.release("nobody")
    assert "requires a client certificate" in info.value.details()


def test_the_server_logs_say_why_a_client_was_refused(cluster):
    # After the tests above (module order). The token refusal is ours: a WARNING naming the peer and the reason.
    # The TLS refusal is grpc's own line (C-core, not Python logging, no peer address): the library does not
    # hand handshake failures to Python, so that line is what the operator gets.
    capacity_log = (cluster.supervisor.state_dir / "capacity.log").read_text(errors="replace")
    assert "refused /bandmaster.capacity.v1.Capacity/" in capacity_log
    assert "missing authorization metadata" in capacity_log and "bearer token not accepted" in capacity_log
    assert "PEER_DID_NOT_RETURN_A_CERTIFICATE" in capacity_log


def test_connect_help_names_files_never_tokens(cluster):
    text = connect_help(cluster)
    assert str(cluster.pki.ca) in text and str(cluster.pki.data_token_file) in text
    for token_file in (cluster.pki.data_token_file, cluster.pki.control_token_file):
        assert _token(token_file) not in text


async def test_the_client_sdk_generates_over_mutual_tls_with_the_data_token(cluster):
    from clients.bandmaster_client import BandmasterClient

    pki = cluster.pki
    credentials = grpc.ssl_channel_credentials(
        pki.ca.read_bytes(), pki.key("client").read_bytes(), pki.cert("client").read_bytes()
    )
    async with BandmasterClient(
        cluster.router.endpoint, credentials=credentials, timeout_s=30, token=_token(pki.data_token_file)
    ) as client:
        async with client.program("secure-sdk-program") as program:
            chunks = [c async for c in program.chat([{"role": "user", "content": "hi"}], max_tokens=4)]
    assert chunks and chunks[-1].finish_reason


def test_no_token_in_any_log(cluster):
    # After every test above has run (module order): refusals were logged nowhere with a token in them.
    tokens = [_token(cluster.pki.data_token_file), _token(cluster.pki.control_token_file)]
    for log in cluster.supervisor.state_dir.glob("*.log"):
        text = log.read_text(errors="replace")
        assert not any(token in text for token in tokens), log


def test_status_cli_over_mutual_tls_from_the_state_dir(cluster, capsys):
    # The state dir gives the addresses, the CA, the client certificate and the control token.
    assert cli_main(["status", "--once", "--state-dir", str(cluster.supervisor.state_dir)]) == 0
    out = capsys.readouterr().out
    assert "of 1 healthy" in out and "utilisation" in out and "scheduler not answering" not in out, out


def test_a_batch_runs_in_a_secure_cluster_with_the_planner_and_the_batch_service(tmp_path):
    """Under --secure the batch service dials the planner with mutual TLS and the control token, serves its
    Batch API over HTTPS behind the router, and sends its requests to the router's HTTPS port with the data
    token; the planner's ready file names no HTTP API."""
    import io
    import json

    running = start_cluster(
        ClusterConfig(
            workers=1,
            worker_kv_tokens=8192,
            worker_speedup=50.0,
            http_port=0,
            state_dir=tmp_path / "state",
            secure=True,
            planner=True,
            log_level="WARNING",
        )
    )
    try:
        client = _client(running, _token(running.pki.data_token_file))
        assert running.batch.ready["http"].startswith("https://") and "http" not in running.planner.ready
        lines = [
            {
                "custom_id": f"s{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "bandmaster-sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            }
            for i in range(3)
        ]
        data = "".join(json.dumps(line) + "\n" for line in lines).encode()
        f = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
        batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="1h")

        def done():
            b = client.batches.retrieve(batch.id)
            return b if b.status == "completed" else None

        b = wait_until(done, timeout_s=90, interval_s=0.2)
        assert b.request_counts.completed == 3 and b.request_counts.failed == 0
        with pytest.raises(openai.AuthenticationError):
            _client(running, "wrong-" + "x" * 26).batches.list()
    finally:
        running.stop()
