"""Issue 21 (edges): a control port (gRPC, /metrics) binds a non-loopback address only when the service
authenticates its callers there, or with --insecure; /metrics takes a bearer token. The refusal names the
rule, at config time and as a real process (exit 2)."""

from __future__ import annotations

import subprocess
import sys

import aiohttp
import pytest

from services.batch.config import load_config as batch_config
from services.capacity.config import load_config as capacity_config
from services.common.auth.security import Port, SecurityConfig, Tokens, check_bind, is_loopback
from services.common.serve.grpc_server import ServiceHost
from services.common.settings.errors import ConfigError
from services.planner.config import load_config as planner_config
from services.router.config import load_config as router_config
from services.scheduler.config import load_config as scheduler_config

RULE = "binding 0.0.0.0 (not loopback) needs --secure or --insecure"
CONTROL = "c" * 32
METRICS = "m" * 32
DATA = "d" * 32
LOADERS = {
    "capacity": (capacity_config, []),
    "scheduler": (scheduler_config, ["--state-path", "none"]),
    "router": (router_config, []),
    "planner": (planner_config, []),
    "batch": (batch_config, ["--planner", "127.0.0.1:1", "--dispatch-url", "http://127.0.0.1:1"]),
}


@pytest.mark.parametrize(
    "host, loopback",
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.0.0.5", False),
        ("192.168.1.2", False),
        ("myhost", False),
        ("localhost.example.com", False),
    ],
)
def test_what_counts_as_loopback(host, loopback):
    assert is_loopback(host) is loopback


OPEN = SecurityConfig()
INSECURE = SecurityConfig(insecure=True)
CONTROL_TOKEN = SecurityConfig(control_tokens=Tokens([CONTROL]))
DATA_ONLY = SecurityConfig(data_tokens=Tokens([DATA]))
METRICS_TOKEN = SecurityConfig(metrics_tokens=Tokens([METRICS]))


@pytest.mark.parametrize(
    "host, port, security, allowed",
    [
        ("127.0.0.1", Port.GRPC, OPEN, True),
        ("localhost", Port.METRICS, OPEN, True),
        ("0.0.0.0", Port.GRPC, OPEN, False),
        ("10.0.0.5", Port.GRPC, OPEN, False),
        ("0.0.0.0", Port.METRICS, OPEN, False),
        ("0.0.0.0", Port.GRPC, INSECURE, True),
        ("0.0.0.0", Port.METRICS, INSECURE, True),
        ("0.0.0.0", Port.GRPC, CONTROL_TOKEN, True),
        ("0.0.0.0", Port.METRICS, CONTROL_TOKEN, False),  # a control token does not guard /metrics
        ("0.0.0.0", Port.GRPC, DATA_ONLY, False),  # a data token leaves the control RPCs open
        ("0.0.0.0", Port.METRICS, METRICS_TOKEN, True),
        ("0.0.0.0", Port.GRPC, METRICS_TOKEN, False),
    ],
)
def test_the_bind_rule(host, port, security, allowed):
    if allowed:
        check_bind("listen", host, host, port, security)
        return
    with pytest.raises(ConfigError) as info:
        check_bind("listen", host, host, port, security)
    assert f"binding {host} (not loopback) needs --secure or --insecure" in info.value.reason
    assert info.value.field == "listen"


@pytest.mark.parametrize("service", sorted(LOADERS))
def test_every_service_refuses_a_non_loopback_listen_without_secure_or_insecure(service):
    load, extra = LOADERS[service]
    with pytest.raises(ConfigError) as info:
        load(["--listen", "0.0.0.0:0", *extra], {})
    assert info.value.field == "listen" and RULE in info.value.reason
    prefix = f"BANDMASTER_{service.upper()}"
    assert load(["--listen", "0.0.0.0:0", "--insecure", *extra], {}).security.insecure
    assert load([*extra], {f"{prefix}_LISTEN": "0.0.0.0:0", f"{prefix}_INSECURE": "true"}).security.insecure
    assert not load(["--listen", "127.0.0.1:0", *extra], {}).security.insecure  # loopback stays easy


@pytest.mark.parametrize("service", sorted(LOADERS))
def test_a_secure_service_also_needs_its_metrics_port_guarded(service):
    load, extra = LOADERS[service]
    env = {"BANDMASTER_CONTROL_TOKEN": CONTROL}
    with pytest.raises(ConfigError) as info:
        load(["--listen", "0.0.0.0:0", "--metrics-port", "0", *extra], env)
    assert info.value.field == "metrics_port" and RULE in info.value.reason and "metrics token" in info.value.reason
    for guarded in (["--metrics-loopback"], ["--metrics-port", "-1"], ["--insecure"]):
        load(["--listen", "0.0.0.0:0", "--metrics-port", "0", *guarded, *extra], env)
    config = load(
        ["--listen", "0.0.0.0:0", "--metrics-port", "0", *extra], {**env, "BANDMASTER_METRICS_TOKEN": METRICS}
    )
    assert config.security.metrics_tokens is not None and "metrics token" in config.security.describe()
    assert METRICS not in repr(config)


def test_a_service_host_built_directly_is_held_to_the_rule_too():
    with pytest.raises(ConfigError) as info:
        ServiceHost("test", listen="0.0.0.0:0", metrics_port=-1)
    assert RULE in info.value.reason


def test_a_metrics_token_file_is_read_like_the_other_token_files(tmp_path):
    token_file = tmp_path / "metrics.token"
    token_file.write_text(METRICS + "\n")
    token_file.chmod(0o600)
    config = capacity_config(["--metrics-token-file", str(token_file)], {})
    assert config.security.metrics_tokens == Tokens([METRICS])
    with pytest.raises(ConfigError) as info:
        capacity_config(["--metrics-token-file", str(token_file)], {"BANDMASTER_METRICS_TOKEN": METRICS})
    assert "not both" in info.value.reason and METRICS not in str(info.value)
    with pytest.raises(ConfigError) as info:
        capacity_config([], {"BANDMASTER_METRICS_TOKEN": "short"})
    assert "shorter than 16" in info.value.reason and "short" not in repr(info.value.value)


async def test_metrics_answers_only_a_metrics_or_control_token_and_never_echoes_one():
    security = SecurityConfig(
        metrics_tokens=Tokens([METRICS]), control_tokens=Tokens([CONTROL]), data_tokens=Tokens([DATA])
    )
    host = ServiceHost("test", listen="127.0.0.1:0", metrics_port=0, security=security, shutdown_grace_seconds=0.1)
    await host.start()
    url = f"http://127.0.0.1:{host.metrics_port}/metrics"
    try:
        async with aiohttp.ClientSession() as http:
            for headers in ({}, {"Authorization": f"Bearer {DATA}"}, {"Authorization": "Bearer " + "x" * 40}):
                async with http.get(url, headers=headers) as response:
                    body = await response.text()
                    assert response.status == 401, headers
                    assert response.headers["WWW-Authenticate"].startswith("Bearer")
                    assert DATA not in body and "x" * 40 not in body and METRICS not in body
            # Prometheus' `authorization: {credentials: ...}` sends exactly this (type Bearer by default).
            for token in (METRICS, CONTROL):
                async with http.get(url, headers={"Authorization": f"Bearer {token}"}) as response:
                    assert response.status == 200 and "bandmaster_auth_refusals" in await response.text()
            async with http.get(url, headers={"Authorization": f"bearer {METRICS}"}) as response:
                assert response.status == 200  # the scheme is case-insensitive (RFC 7235)
                text = await response.text()
        assert 'bandmaster_auth_refusals_total{interface="metrics",reason="unauthenticated"} 3.0' in text
    finally:
        await host.stop()


async def test_metrics_loopback_binds_metrics_on_loopback_only():
    security = SecurityConfig(insecure=True, metrics_loopback=True)
    host = ServiceHost("test", listen="0.0.0.0:0", metrics_port=0, security=security, shutdown_grace_seconds=0.1)
    await host.start()
    try:
        assert host.metrics_host == "127.0.0.1"
        (site,) = host._http_runner.sites  # type: ignore[union-attr]
        assert {s.getsockname()[0] for s in site._server.sockets} == {"127.0.0.1"}
    finally:
        await host.stop()


@pytest.mark.parametrize("module", ["services.capacity", "services.router"])
def test_the_process_refuses_to_start_naming_the_rule(module):
    done = subprocess.run(
        [sys.executable, "-m", module, "--listen", "0.0.0.0:0", "--metrics-port", "-1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert RULE in done.stderr and "listen" in done.stderr and "Traceback" not in done.stderr


async def test_the_planner_scrapes_a_guarded_router_metrics_port_with_its_token():
    from services.common.clock import SystemClock
    from services.planner.adapters.observe import RouterTrafficSource

    security = SecurityConfig(metrics_tokens=Tokens([METRICS]), control_tokens=Tokens([CONTROL]))
    host = ServiceHost("router", listen="127.0.0.1:0", metrics_port=0, security=security, shutdown_grace_seconds=0.1)
    await host.start()
    url = f"http://127.0.0.1:{host.metrics_port}"
    sources = [RouterTrafficSource([url], SystemClock(), timeout_s=2, metrics_token=t) for t in ("", CONTROL, METRICS)]
    try:
        with pytest.raises(RuntimeError, match="answered 401"):
            await sources[0]._scrape(url)
        for source in sources[1:]:
            assert await source._scrape(url) == (0.0, 0.0, 0.0, 0.0)
    finally:
        for source in sources:
            if source._session is not None:
                await source._session.close()
        await host.stop()
