"""Ports: a taken one is a PortInUse naming it and its flag (also when the holder is another gRPC server,
which grpc's default SO_REUSEPORT would silently share with); the metrics port answers JSON errors."""

import aiohttp
import pytest

from services.common.serve.grpc_server import ServiceHost
from services.common.serve.ports import PortInUse, port_free


async def test_a_second_service_on_the_same_grpc_port_is_refused_not_shared():
    first = ServiceHost("first", listen="127.0.0.1:0", metrics_port=-1, shutdown_grace_seconds=0.1)
    await first.start()
    try:
        assert not port_free("127.0.0.1", first.grpc_port)
        second = ServiceHost("second", listen=f"127.0.0.1:{first.grpc_port}", metrics_port=-1)
        with pytest.raises(PortInUse) as caught:
            await second.start()
        assert str(caught.value) == (
            f"port {first.grpc_port} (second gRPC) on 127.0.0.1 is already in use; choose another with --listen"
        )
    finally:
        await first.stop()


async def test_the_metrics_port_answers_openai_style_json_errors():
    host = ServiceHost("test", listen="127.0.0.1:0", metrics_port=0, shutdown_grace_seconds=0.1)
    await host.start()
    try:
        base = f"http://127.0.0.1:{host.metrics_port}"
        async with aiohttp.ClientSession() as http:
            async with http.get(base + "/nope") as response:
                assert response.status == 404 and response.content_type == "application/json"
                body = await response.json()
                assert body == {
                    "error": {
                        "message": "no route '/nope'",
                        "type": "invalid_request_error",
                        "param": None,
                        "code": "not_found",
                    }
                }
            async with http.post(base + "/metrics") as response:
                assert response.status == 405 and "GET" in response.headers["Allow"]
                error = (await response.json())["error"]
                assert error["code"] == "method_not_allowed" and set(error) == {"message", "type", "param", "code"}
            async with http.get(base + "/metrics") as response:
                assert response.status == 200
    finally:
        await host.stop()


async def test_the_metrics_port_404_quotes_at_most_64_characters_of_the_path():
    from services.common.web.openai_errors import ECHO_MAX_CHARS

    host = ServiceHost("test", listen="127.0.0.1:0", metrics_port=0, shutdown_grace_seconds=0.1)
    await host.start()
    try:
        long_path = "/" + "a" * 4000
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{host.metrics_port}{long_path}") as response:
                assert response.status == 404
                message = (await response.json())["error"]["message"]
            async with http.post(f"http://127.0.0.1:{host.metrics_port}/metrics{'b' * 3000}") as response:
                assert response.status == 404
        assert message == f"no route {long_path[:ECHO_MAX_CHARS]!r}..."
        assert len(message) < 100
    finally:
        await host.stop()


def test_the_router_quotes_with_the_same_one_helper():
    from services.common.web import http_errors, openai_errors
    from services.router import errors

    assert errors.quoted is openai_errors.quoted and errors.ECHO_MAX_CHARS == openai_errors.ECHO_MAX_CHARS
    assert http_errors.quoted is openai_errors.quoted


def test_every_openai_error_body_comes_from_the_one_builder():
    from services.batch import http_api as batch_http
    from services.common.web import http_errors, openai_errors
    from services.router import errors

    # The batch service's HTTP edge (split out of the planner) uses the one builder, not a copy.
    assert batch_http.error_body is openai_errors.error_body
    assert openai_errors.error_body("m") == {
        "error": {"message": "m", "type": "invalid_request_error", "param": None, "code": None}
    }
    assert errors.ModelNotFound("x").body() == openai_errors.error_body(
        "The model 'x' does not exist.", code="model_not_found", param="model"
    )
    assert http_errors.status_error_body(503, "busy") == openai_errors.error_body(
        "busy", type_="server_error", code="503"
    )
    assert http_errors.status_error_body(404, "no route")["error"]["code"] == "not_found"
