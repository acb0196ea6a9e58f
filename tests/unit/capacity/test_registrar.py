"""The worker registrar (services/capacity/registrar.py): its config mapping, and register / re-register
after a capacity restart / deregister on stop against a real in-process capacity service."""

import asyncio

import pytest
from aiohttp import web

from bandmaster.capacity.v1 import capacity_pb2 as pb
from bandmaster.capacity.v1 import capacity_pb2_grpc as pb_grpc
from services.capacity.config import CapacityConfig
from services.capacity.registrar import Registrar, load_config
from services.capacity.server import start_capacity
from services.common.settings.errors import ConfigError
from tests.support.eventually import assert_eventually


@pytest.mark.parametrize(
    "argv, env, field",
    [
        ([], {}, "worker_url"),
        (["--worker-url", "http://10.0.0.1"], {}, "worker_url"),  # no port
        (["--worker-url", "http://10.0.0.1:30000", "--capacity-addr", "capacity"], {}, "capacity_addr"),
        (
            ["--worker-url", "http://10.0.0.1:30000", "--interval-seconds", "1", "--timeout-seconds", "2"],
            {},
            "timeout_seconds",
        ),
        (["--worker-url", "http://10.0.0.1:30000", "--no-such-flag"], {}, "argv"),
    ],
)
def test_invalid_config_names_the_setting(argv, env, field):
    with pytest.raises(ConfigError) as info:
        load_config(argv, env)
    assert info.value.field == field


def test_flags_environment_and_the_default_id():
    c = load_config(
        ["--worker-url", "http://10.0.0.1:30000/"],
        {"BANDMASTER_REGISTRAR_CAPACITY_ADDR": "capacity:50051", "BANDMASTER_CONTROL_TOKEN": "t" * 32},
    )
    assert (c.capacity_addr, c.worker_url, c.worker_id) == ("capacity:50051", "http://10.0.0.1:30000", "10.0.0.1:30000")
    assert c.security.control_tokens is not None
    assert load_config(["--worker-url", "http://h:1", "--worker-id", "pod-a"], {}).worker_id == "pod-a"


async def _capacity(listen="127.0.0.1:0"):
    return await start_capacity(
        CapacityConfig(
            listen=listen,
            metrics_port=-1,
            poll_interval_seconds=0.2,
            poll_timeout_seconds=0.1,
            shutdown_grace_seconds=0.1,
        )
    )


async def _worker_ids(address):
    import grpc

    async with grpc.aio.insecure_channel(address) as channel:
        snap = await pb_grpc.CapacityStub(channel).ListWorkers(pb.ListWorkersRequest(), timeout=2)
    return {w.worker_id for w in snap.workers}


async def test_registers_reregisters_after_a_capacity_restart_and_deregisters_on_stop():
    capacity = await _capacity()
    address = capacity.address
    registrar = Registrar(
        load_config(
            [
                "--capacity-addr",
                address,
                "--worker-url",
                "http://127.0.0.1:9",
                "--interval-seconds",
                "0.2",
                "--timeout-seconds",
                "0.2",
                "--no-wait-for-health",
            ],
            {},
        )
    )
    task = asyncio.create_task(registrar.run())
    try:

        async def registered():
            return "127.0.0.1:9" in await _worker_ids(address)

        await assert_eventually(registered)

        # The capacity registry is in memory: a restart on the same address forgets the worker.
        await capacity.stop()
        capacity = await _capacity(address)
        await assert_eventually(registered)
        assert registrar.registrations >= 2

        registrar.stop()
        await asyncio.wait_for(task, 5)
        assert "127.0.0.1:9" not in await _worker_ids(address)
    finally:
        registrar.stop()
        await asyncio.gather(task, return_exceptions=True)
        await capacity.stop()


async def test_waits_for_the_workers_health_before_registering():
    answers: list[int] = []
    status = {"code": 503}

    async def health(_request):
        answers.append(status["code"])
        return web.Response(status=status["code"])

    app = web.Application()
    app.router.add_get("/health", health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    capacity = await _capacity()
    registrar = Registrar(
        load_config(
            [
                "--capacity-addr",
                capacity.address,
                "--worker-url",
                f"http://127.0.0.1:{port}",
                "--interval-seconds",
                "0.2",
                "--timeout-seconds",
                "0.2",
            ],
            {},
        )
    )
    task = asyncio.create_task(registrar.run())
    try:
        # Two 503 answers seen: registration only ever follows a 200, so nothing is registered yet.
        await assert_eventually(lambda: len(answers) >= 2)
        assert registrar.registrations == 0
        assert f"127.0.0.1:{port}" not in await _worker_ids(capacity.address)
        status["code"] = 200

        async def registered():
            return f"127.0.0.1:{port}" in await _worker_ids(capacity.address)

        await assert_eventually(registered)
    finally:
        registrar.stop()
        await asyncio.gather(task, return_exceptions=True)
        await capacity.stop()
        await runner.cleanup()


async def test_stopped_before_the_worker_is_healthy_registers_nothing():
    registrar = Registrar(
        load_config(
            ["--capacity-addr", "127.0.0.1:9", "--worker-url", "http://127.0.0.1:9", "--timeout-seconds", "0.2"], {}
        )
    )
    task = asyncio.create_task(registrar.run())
    await asyncio.sleep(0.05)
    registrar.stop()
    await asyncio.wait_for(task, 5)
    assert registrar.registrations == 0
