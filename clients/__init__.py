"""Clients of Bandmaster: the harness SDK (a gRPC client of the router and session headers for OpenAI clients) and
the agent-program player (`player`, with its `workloads`) that `bandmaster bench` and the demo run.
"""

# First, before anything here imports grpc: the services package turns gRPC's fork handlers off, and gRPC reads
# that setting once, at its first import (tests/unit/common/test_fork_safety.py).
import services  # noqa: E402,F401
from clients.bandmaster_client import BandmasterClient, GenerateError, Program, Unreachable, session_headers

__all__ = ["BandmasterClient", "GenerateError", "Program", "Unreachable", "session_headers"]
