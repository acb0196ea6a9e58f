"""ServiceHost: health, reflection, /metrics and graceful shutdown order, against a real server on port 0."""

import json

import aiohttp
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client import Counter

from services.common.grpc_server import ServiceHost


async def test_health_reflection_metrics_and_shutdown(tmp_path):
    host = ServiceHost("test", listen="127.0.0.1:0", metrics_port=0, shutdown_grace_seconds=0.5)
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

        def requests():
            yield reflection_pb2.ServerReflectionRequest(list_services="")

        names = []
        async for response in reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(requests()):
            names = [s.name for s in response.list_services_response.service]
            break
        assert "grpc.health.v1.Health" in names

    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{host.metrics_port}/metrics") as response:
            assert response.status == 200
            assert "bandmaster_test_things_total 3.0" in await response.text()

    await host.stop()
    assert order == [("loop", health_pb2.HealthCheckResponse.NOT_SERVING)]
    await host.stop()  # idempotent
