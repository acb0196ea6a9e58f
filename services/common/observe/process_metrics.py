"""The series every service's /metrics has besides its own: the process's, and what build it runs.

`register_process_metrics(registry, service)` is called once per registry where a service's metrics are
set up (`ServiceHost` for the gRPC services, `SimWorkerMetrics` for the simulated worker):

- prometheus_client's `ProcessCollector`: `process_cpu_seconds_total`, `process_resident_memory_bytes`,
  `process_virtual_memory_bytes`, `process_open_fds`, `process_max_fds`, `process_start_time_seconds`
  (Linux /proc; nothing elsewhere). The default registry has it; the services' own registries did not;
- `bandmaster_build_info{service, version, python_version} 1`, to join on in queries and to see a fleet
  mid-upgrade.

It also turns off the `<name>_created` series that prometheus_client adds to every counter and histogram
(a Unix time per series: doubles the series count and nothing here queries it). That switch is global to
the process, read at each scrape.
"""

from __future__ import annotations

import platform
from importlib import metadata

import prometheus_client
from prometheus_client import CollectorRegistry, Gauge, ProcessCollector


def bandmaster_version() -> str:
    try:
        return metadata.version("bandmaster")
    except metadata.PackageNotFoundError:
        return "unknown"  # run from a checkout that was never installed


def register_process_metrics(registry: CollectorRegistry, service: str) -> None:
    prometheus_client.disable_created_metrics()
    ProcessCollector(registry=registry)
    Gauge(
        "bandmaster_build_info",
        "always 1; the labels say which service, Bandmaster version and Python run this process",
        ["service", "version", "python_version"],
        registry=registry,
    ).labels(service, bandmaster_version(), platform.python_version()).set(1)
