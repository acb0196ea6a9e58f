"""Domain errors of the scheduler core. The shell maps them to gRPC status codes in one place."""


class SchedulerError(Exception):
    """Base class."""


class DuplicateRequest(SchedulerError):
    """An admission reused a request id that is still in flight (gRPC: ALREADY_EXISTS)."""


class MissingRequestId(SchedulerError):
    """An admission came without a request id (gRPC: INVALID_ARGUMENT)."""


class RequestMismatch(SchedulerError):
    """A Complete named another program than its request was admitted for (gRPC: INVALID_ARGUMENT)."""
