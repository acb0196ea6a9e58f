"""The router's grpc.health.v1 follows its fleet like /health: NOT_SERVING (and 503) while no worker is
healthy, SERVING (and 200) while one is, for the overall status and the Router service alike."""

import aiohttp
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.router.ingress.grpc_api import SERVICE_NAME
from tests.support.eventually import assert_eventually
from tests.support.router_inprocess import InProcessRouter

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _statuses(address: str) -> tuple[int, int]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        overall = await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
        router = await stub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=5)
    return overall.status, router.status


async def _http_health(url: str) -> int:
    async with aiohttp.ClientSession() as http:
        async with http.get(url + "/health") as response:
            return response.status


async def test_grpc_health_and_http_health_follow_the_fleet():
    router = await InProcessRouter.start(["ok"], scheduler=False)
    address = router.running.grpc_address
    try:
        assert await _statuses(address) == (SERVING, SERVING)
        assert await _http_health(router.url) == 200

        router.set_workers([])  # the last healthy worker left

        async def not_serving():
            assert await _statuses(address) == (NOT_SERVING, NOT_SERVING)
            return True

        await assert_eventually(not_serving)
        assert await _http_health(router.url) == 503

        router.set_workers([0])

        async def serving():
            assert await _statuses(address) == (SERVING, SERVING)
            return True

        await assert_eventually(serving)
        assert await _http_health(router.url) == 200
    finally:
        await router.close()


async def test_a_router_that_starts_without_workers_is_not_serving():
    router = await InProcessRouter.start([], scheduler=False)
    try:
        assert await _statuses(router.running.grpc_address) == (NOT_SERVING, NOT_SERVING)
    finally:
        await router.close()
