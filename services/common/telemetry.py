"""OpenTelemetry set-up: OTLP export when OTEL_EXPORTER_OTLP_ENDPOINT is set, nothing otherwise.

Tests pass an in-memory exporter. Spans are one per decision (`capacity.recompute`,
`scheduler.tick`, ...), with few bounded attributes.
"""

from __future__ import annotations

import logging
import os
from typing import Mapping

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter

log = logging.getLogger(__name__)


class Telemetry:
    """Owns a tracer provider for one service process (or one in-process test server)."""

    def __init__(self, service_name: str, provider: TracerProvider, exporting: bool) -> None:
        self.service_name = service_name
        self.provider = provider
        self.exporting = exporting

    def tracer(self, name: str) -> trace.Tracer:
        return self.provider.get_tracer(name)

    def shutdown(self) -> None:
        """Flush and stop exporting. Safe to call twice."""
        try:
            self.provider.force_flush(timeout_millis=5_000)
        finally:
            self.provider.shutdown()


def setup_telemetry(
    service_name: str,
    *,
    env: Mapping[str, str] | None = None,
    exporter: SpanExporter | None = None,
    set_global: bool = True,
) -> Telemetry:
    """Build the provider. `exporter` (tests) wins over the environment; with neither, spans are
    created (so context still propagates) but never exported."""
    env = os.environ if env is None else env
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    exporting = False
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        exporting = True
    elif env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        exporting = True
        log.info("telemetry: exporting spans by OTLP for service %s", service_name)
    if set_global:
        try:
            trace.set_tracer_provider(provider)
        except Exception:  # the global provider can only be set once per process
            log.debug("telemetry: global tracer provider already set")
    return Telemetry(service_name, provider, exporting)
