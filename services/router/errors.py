"""The router's domain errors and their one mapping to HTTP statuses, OpenAI error bodies and gRPC codes.

Handlers raise a `RouterError`; the HTTP edge turns it into `{"error": {message, type, param, code}}`
with `http_status`, the gRPC edge into `grpc_code`. Nothing else maps errors.
"""

from __future__ import annotations

import grpc


class RouterError(Exception):
    http_status = 500
    grpc_code = grpc.StatusCode.INTERNAL
    error_type = "internal_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param,
                          "code": self.code}}


class BadRequest(RouterError):
    """Malformed body or header (nothing is forwarded to a worker)."""

    http_status = 400
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT
    error_type = "invalid_request_error"


class BodyTooLarge(BadRequest):
    http_status = 413


class ModelNotFound(RouterError):
    http_status = 404
    grpc_code = grpc.StatusCode.NOT_FOUND
    error_type = "invalid_request_error"

    def __init__(self, model: str) -> None:
        super().__init__(f"The model `{model}` does not exist.", param="model", code="model_not_found")


class NoHealthyWorker(RouterError):
    http_status = 503
    grpc_code = grpc.StatusCode.UNAVAILABLE
    error_type = "service_unavailable"


class WorkerFailed(RouterError):
    """The worker refused the connection, answered 5xx, or broke the stream."""

    http_status = 502
    grpc_code = grpc.StatusCode.UNAVAILABLE
    error_type = "upstream_error"


class WorkerTimeout(RouterError):
    http_status = 504
    grpc_code = grpc.StatusCode.DEADLINE_EXCEEDED
    error_type = "upstream_timeout"


class WorkerRejected(RouterError):
    """The worker answered 4xx (its validation): passed through with the worker's status, never retried."""

    grpc_code = grpc.StatusCode.INVALID_ARGUMENT
    error_type = "invalid_request_error"

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.http_status = status
        if status == 404:
            self.grpc_code = grpc.StatusCode.NOT_FOUND


class ShuttingDown(RouterError):
    http_status = 503
    grpc_code = grpc.StatusCode.UNAVAILABLE
    error_type = "service_unavailable"
