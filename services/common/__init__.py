"""Pieces every Bandmaster service shares: config errors, clock, logging, telemetry, gRPC bootstrap."""
