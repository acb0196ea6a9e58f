"""Issue 21 (edges): workers that need an API key (SGLang's --api-key) and https workers.

The simworker behaves as SGLang does with --api-key; the worker-client settings (router, capacity,
registrar) read the key once and send it as `Authorization: Bearer`; the capacity poller and the router's
upstream session pass it; https workers are verified against the system roots or --worker-ca-file."""

from __future__ import annotations

import ssl

import aiohttp
import pytest
from aiohttp import web

from services.capacity.adapters.poller import SglangPoller
from services.capacity.config import load_config as capacity_config
from services.capacity.core.cards import CardCache
from services.capacity.core.registry import PollFailed, PollOk
from services.capacity.registrar import load_config as registrar_config
from services.common.auth.certs import ensure_local_pki
from services.common.settings.errors import ConfigError
from services.common.sglang.worker_client import WORKER_API_KEY_ENV, WorkerClientConfig
from services.router.adapters.upstream import Upstream
from services.router.config import load_config as router_config
from services.router.errors import WorkerRejected
from services.simworker.config import load_config as simworker_config
from services.simworker.server import start_simworker
from tests.support.sglang_stub import sglang_info

KEY = "sk-worker-key-123"
UNAUTHORIZED = {"error": "Unauthorized"}


@pytest.fixture
async def keyed_worker():
    worker = await start_simworker(
        simworker_config(["--port", "0", "--model-name", "m", "--speedup", "100", "--api-key", KEY], {})
    )
    yield f"http://127.0.0.1:{worker.port}"
    await worker.stop()


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("GET", "/server_info", None),
        ("GET", "/get_server_info", None),
        ("GET", "/v1/models", None),
        ("POST", "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 1}}),
        ("POST", "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
        ("GET", "/get_load", None),
        ("GET", "/no/such/path", None),  # refused before routing, as in SGLang: no 404 without the key
    ],
)
async def test_simworker_with_api_key_refuses_what_sglang_refuses(keyed_worker, method, path, body):
    async with aiohttp.ClientSession() as http:
        for headers in ({}, {"Authorization": "Bearer wrong-key"}, {"Authorization": KEY}):
            async with http.request(method, keyed_worker + path, json=body, headers=headers) as response:
                assert response.status == 401, (path, headers)
                assert await response.json() == UNAUTHORIZED
                assert "wrong-key" not in await response.text()
        for scheme in ("Bearer", "bearer"):
            async with http.request(
                method, keyed_worker + path, json=body, headers={"Authorization": f"{scheme} {KEY}"}
            ) as response:
                assert response.status == (404 if path == "/no/such/path" else 200), path


@pytest.mark.parametrize("path", ["/health", "/health_generate", "/metrics"])
async def test_simworker_probes_and_metrics_need_no_key(keyed_worker, path):
    async with aiohttp.ClientSession() as http:
        async with http.get(keyed_worker + path) as response:
            assert response.status == 200, path
        async with http.options(keyed_worker + "/generate") as response:
            assert response.status != 401  # OPTIONS passes the key check (SGLang: CORS preflight)


def test_the_simworker_key_stays_out_of_its_repr():
    config = simworker_config(["--api-key", KEY], {})
    assert config.api_key == KEY and KEY not in repr(config)
    assert simworker_config([], {"SIMWORKER_API_KEY": KEY}).api_key == KEY


@pytest.mark.parametrize("load", [capacity_config, router_config])
def test_services_read_the_worker_key_from_env_or_file_never_showing_it(load, tmp_path):
    config = load([], {WORKER_API_KEY_ENV: KEY})
    assert config.worker_client.headers == {"Authorization": f"Bearer {KEY}"}
    assert KEY not in repr(config)
    key_file = tmp_path / "worker.key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    assert load(["--worker-api-key-file", str(key_file)], {}).worker_client.api_key.first == KEY
    with pytest.raises(ConfigError) as info:
        load(["--worker-api-key-file", str(key_file)], {WORKER_API_KEY_ENV: KEY})
    assert "not both" in info.value.reason and KEY not in str(info.value)
    key_file.chmod(0o622)
    with pytest.raises(ConfigError) as info:
        load(["--worker-api-key-file", str(key_file)], {})
    assert "writable by other users" in info.value.reason
    with pytest.raises(ConfigError) as info:
        load([], {WORKER_API_KEY_ENV: "two words"})
    assert info.value.field == WORKER_API_KEY_ENV and "two" not in str(info.value)
    with pytest.raises(ConfigError) as info:
        load(["--worker-ca-file", str(tmp_path / "missing.pem")], {})
    assert info.value.field == "worker_ca_file"
    with pytest.raises(ConfigError) as info:
        load(["--worker-cert-file", str(key_file)], {})
    assert info.value.field == "worker_key_file"


def test_the_registrar_takes_the_same_worker_settings():
    config = registrar_config(["--worker-url", "https://10.0.0.1:30000"], {WORKER_API_KEY_ENV: KEY})
    assert config.worker_client.api_key.first == KEY and KEY not in repr(config)


async def poll(url: str, client: WorkerClientConfig):
    poller = SglangPoller(2.0, CardCache(), worker_client=client)
    await poller.start()
    try:
        return await poller.poll(url)
    finally:
        await poller.close()


async def test_capacity_polls_a_keyed_worker_only_with_its_key(keyed_worker):
    refused = await poll(keyed_worker, WorkerClientConfig())
    assert isinstance(refused, PollFailed) and "HTTP 401" in refused.detail
    assert "no worker API key given" in refused.detail
    wrong = await poll(keyed_worker, capacity_config([], {WORKER_API_KEY_ENV: "not-the-key"}).worker_client)
    assert isinstance(wrong, PollFailed) and "wrong worker API key" in wrong.detail
    assert "not-the-key" not in wrong.detail
    ok = await poll(keyed_worker, capacity_config([], {WORKER_API_KEY_ENV: KEY}).worker_client)
    assert isinstance(ok, PollOk) and ok.card.gpu_kv_tokens > 0


async def test_the_router_upstream_session_sends_the_key(keyed_worker):
    client = router_config([], {WORKER_API_KEY_ENV: KEY}).worker_client
    timeouts = dict(connect_timeout_s=2, first_token_timeout_s=5, inter_token_timeout_s=5, response_timeout_s=5)
    upstream = Upstream(**timeouts, headers=client.headers, worker_ssl=client.ssl_context())
    bare = Upstream(**timeouts)
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 1}}
    try:
        response = await upstream.post("w0", keyed_worker + "/generate", body, {}, stream=False)
        assert response.status == 200
        response.release()
        with pytest.raises(WorkerRejected) as refused:  # without the key: the worker's 401
            await bare.post("w0", keyed_worker + "/generate", body, {}, stream=False)
        assert refused.value.http_status == 401
    finally:
        await upstream.close()
        await bare.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return ensure_local_pki(tmp_path_factory.mktemp("pki"), ["worker", "capacity"])


@pytest.fixture
async def https_worker(pki):
    """An https stand-in for SGLang serving /server_info and /health with the local CA's certificate."""
    info = sglang_info(max_total_num_tokens=4096, page_size=16)

    async def server_info(_request):
        return web.json_response(info)

    async def health(_request):
        return web.Response(text="")

    app = web.Application()
    app.router.add_get("/server_info", server_info)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.cert("worker"), pki.key("worker"))
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"https://127.0.0.1:{port}"
    await runner.cleanup()


async def test_https_workers_are_verified_with_the_system_roots_or_the_worker_ca(https_worker, pki):
    unverified = await poll(https_worker, WorkerClientConfig())  # system roots: the local CA is not among them
    assert isinstance(unverified, PollFailed) and "certificate" in unverified.detail.lower()
    verified = await poll(https_worker, capacity_config(["--worker-ca-file", str(pki.ca)], {}).worker_client)
    assert isinstance(verified, PollOk) and verified.card.gpu_kv_tokens == 4096
    client = capacity_config(
        [
            "--worker-ca-file",
            str(pki.ca),
            "--worker-cert-file",
            str(pki.cert("capacity")),
            "--worker-key-file",
            str(pki.key("capacity")),
        ],
        {},
    ).worker_client
    assert isinstance(await poll(https_worker, client), PollOk)
    assert client.describe() == "no API key, worker CA, client certificate"
