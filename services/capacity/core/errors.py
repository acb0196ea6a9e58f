"""Domain errors of the capacity service. `servicer.py` maps each to one gRPC status code."""

from __future__ import annotations


class InvalidArgument(ValueError):
    """A request that can never succeed as sent (bad URL, negative figures, ...)."""


class AlreadyExists(Exception):
    """A registration that conflicts with an existing worker."""
