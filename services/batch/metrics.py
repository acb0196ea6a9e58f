"""Prometheus metrics of the batch service, on the ServiceHost's per-instance registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class BatchMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.dispatch_sent = Counter("bandmaster_batch_dispatch_sent", "Batch requests sent", registry=r)
        self.dispatch_results = Counter(
            "bandmaster_batch_dispatch_results", "Batch results written, by file", ["file"], registry=r
        )
        self.dispatch_rate_cap = Gauge(
            "bandmaster_batch_dispatch_rate_cap_rps",
            "Rate the dispatcher applies now (0 when the lease is missing, expired or a pause)",
            registry=r,
        )
        self.batches = Counter("bandmaster_batch_transitions", "Batch status transitions", ["status"], registry=r)
        self.planner_errors = Counter(
            "bandmaster_batch_planner_errors",
            "Failed calls to the planner, by call (watch_lease, report, submit)",
            ["call"],
            registry=r,
        )
        self.lease_valid = Gauge(
            "bandmaster_batch_lease_valid", "1 while a valid (unexpired) drain lease is held, else 0", registry=r
        )
        self.files_deleted = Counter(
            "bandmaster_batch_files_deleted",
            "Stored files deleted, by kind (input, output, error) and reason (expired: the cleanup loop; "
            "client: DELETE /v1/files/{id})",
            ["kind", "reason"],
            registry=r,
        )
        self.file_bytes_deleted = Counter(
            "bandmaster_batch_file_bytes_deleted",
            "Bytes of stored files deleted, by reason (expired, client)",
            ["reason"],
            registry=r,
        )
        for call in ("watch_lease", "report", "submit"):
            self.planner_errors.labels(call)
        for reason in ("expired", "client"):
            self.file_bytes_deleted.labels(reason)
            for kind in ("input", "output", "error"):
                self.files_deleted.labels(kind, reason)

    def record_deleted(self, deleted: dict, reason: str) -> None:
        """A file deleted (`deleted` as Registry.delete_file returns it)."""
        self.files_deleted.labels(deleted["kind"], reason).inc()
        self.file_bytes_deleted.labels(reason).inc(deleted["bytes"])
