"""The benchmarks (`make bench-*`)."""

# Before any benchmark imports grpc: the services package turns gRPC's fork handlers off (see
# harness/__init__.py; the benchmarks fork worker stacks after using gRPC).
import services  # noqa: F401
