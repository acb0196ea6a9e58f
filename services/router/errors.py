"""The router's domain errors and their one mapping to HTTP statuses, OpenAI error bodies and gRPC codes.

Handlers raise a `RouterError`; the HTTP edge turns it into `{"error": {message, type, param, code}}`
with `http_status` (and `Retry-After` when `retry_after_s` is set), the gRPC edge into `grpc_code`.
Nothing else maps errors. Messages never quote credentials or worker URLs, and quote a client's value
only through `quoted` (at most `ECHO_MAX_CHARS` of it).
"""

from __future__ import annotations

import grpc

# The one body builder and quoting helper live in services/common/web/openai_errors.py (every HTTP edge uses them).
from services.common.web.openai_errors import ECHO_MAX_CHARS, error_body, quoted  # noqa: F401 - re-exported


class RouterError(Exception):
    http_status = 500
    grpc_code = grpc.StatusCode.INTERNAL
    error_type = "internal_error"

    def __init__(
        self, message: str, *, param: str | None = None, code: str | None = None, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s

    def body(self) -> dict:
        return error_body(self.message, type_=self.error_type, code=self.code, param=self.param)


class BadRequest(RouterError):
    """Malformed body or header (nothing is forwarded to a worker)."""

    http_status = 400
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT
    error_type = "invalid_request_error"


class ContextLengthExceeded(BadRequest):
    """The prompt cannot fit the model's context (core/context_fit.py): refused before Admit."""

    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message, param=param, code="context_length_exceeded")


class BodyTooLarge(BadRequest):
    http_status = 413


class UnsupportedMediaType(BadRequest):
    """A request body in a Content-Encoding the router does not decode (only identity, gzip, deflate)."""

    http_status = 415


class RequestTimeout(BadRequest):
    """The client did not send its body within the body timeout (the connection is closed)."""

    http_status = 408
    grpc_code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(RouterError):
    """No such route."""

    http_status = 404
    grpc_code = grpc.StatusCode.UNIMPLEMENTED
    error_type = "invalid_request_error"


class MethodNotAllowed(NotFound):
    http_status = 405


class TooManyRequests(RouterError):
    """A client over its program cap or new-program rate (`code` says which)."""

    http_status = 429
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    error_type = "rate_limit_error"


class Overloaded(RouterError):
    """The HTTP port is at its connection cap."""

    http_status = 503
    grpc_code = grpc.StatusCode.UNAVAILABLE
    error_type = "service_unavailable"


class Internal(RouterError):
    """A bug: the client gets a generic message, the log the traceback."""


class ModelNotFound(RouterError):
    http_status = 404
    grpc_code = grpc.StatusCode.NOT_FOUND
    error_type = "invalid_request_error"

    def __init__(self, model: str) -> None:
        super().__init__(f"The model {quoted(model)} does not exist.", param="model", code="model_not_found")


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


class WorkerUnresponsive(WorkerTimeout):
    """Past the turn's answer deadline the worker did not answer its health probe (taken for frozen)."""


class WorkerEvacuated(WorkerFailed):
    """The capacity service marked the turn's worker unhealthy (or removed it) before the turn sent anything."""


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


class BatchServiceMissing(RouterError):
    """A Batch API route (`/v1/files*`, `/v1/batches*`) on a router started without `--batch-url`: a 404
    (the route is not served here; a client's mistake to fix by pointing at a router with a batch service), not a 5xx
    that monitoring would count as the router failing."""

    http_status = 404
    grpc_code = grpc.StatusCode.UNIMPLEMENTED
    error_type = "not_found_error"
