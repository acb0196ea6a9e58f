"""ServiceHost: health, reflection (only when asked), /metrics and graceful shutdown order, against a real
server on port 0."""

import json

import aiohttp
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client import Counter

from services.common.auth.security import SecurityConfig
from services.common.serve.grpc_server import ServiceHost


async def _list_services(channel) -> list[str]:
    def requests():
        yield reflection_pb2.ServerReflectionRequest(list_services="")

    async for response in reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(requests()):
        return [s.name for s in response.list_services_response.service]
    return []


async def test_reflection_is_off_by_default():
    host = ServiceHost("test", listen="127.0.0.1:0", metrics_port=-1, shutdown_grace_seconds=0.2)
    await host.start()
    try:
        async with grpc.aio.insecure_channel(host.address) as ch:
            try:
                await _list_services(ch)
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.UNIMPLEMENTED
            else:
                raise AssertionError("reflection answered without --grpc-reflection")
    finally:
        await host.stop()


async def test_health_reflection_metrics_and_shutdown(tmp_path):
    host = ServiceHost(
        "test",
        listen="127.0.0.1:0",
        metrics_port=0,
        shutdown_grace_seconds=0.5,
        security=SecurityConfig(grpc_reflection=True),
    )
    Counter("bandmaster_test_things", "things", registry=host.registry).inc(3)
    order = []

    async def stop_loop():
        # Health must already say NOT_SERVING when loops are stopped.
        async with grpc.aio.insecure_channel(host.address) as ch:
            reply = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2)
        order.append(("loop", reply.status))

    host.on_stop(stop_loop)
    await host.start()
    ready = tmp_path / "ready.json"
    host.write_ready_file(str(ready))
    assert json.loads(ready.read_text())["grpc"] == host.address

    async with grpc.aio.insecure_channel(host.address) as ch:
        reply = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        assert "grpc.health.v1.Health" in await _list_services(ch)

    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{host.metrics_port}/metrics") as response:
            assert response.status == 200
            assert "bandmaster_test_things_total 3.0" in await response.text()

    await host.stop()
    assert order == [("loop", health_pb2.HealthCheckResponse.NOT_SERVING)]
    await host.stop()  # idempotent
