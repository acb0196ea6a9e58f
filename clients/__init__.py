"""Harness SDK for Bandmaster: a gRPC client of the router and helpers for OpenAI clients."""

from clients.bandmaster_client import BandmasterClient, GenerateError, Program, Unreachable, session_headers

__all__ = ["BandmasterClient", "GenerateError", "Program", "Unreachable", "session_headers"]
