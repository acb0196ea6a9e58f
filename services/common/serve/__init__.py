"""Serving a gRPC service: the server host, the entry point, listening ports, domain errors as gRPC status, the health
probe."""
