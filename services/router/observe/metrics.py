"""Prometheus metrics of one router process (one registry per router, so in-process tests never share series).

Counted per request and per decision, never per token.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

TRAFFIC = ("online", "batch")


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "bandmaster_router_requests",
            "Requests by API route, path, outcome and traffic (online, or batch: marked "
            "X-Bandmaster-Traffic: batch by the batch service's dispatcher)",
            ("route", "path", "outcome", "traffic"),
            registry=r,
        )
        self.in_flight = Gauge(
            "bandmaster_router_requests_in_flight", "Turns being served, by traffic", ("traffic",), registry=r
        )
        for traffic in TRAFFIC:
            self.in_flight.labels(traffic)  # both series exist from the start (a scrape sees 0, not absent)
        self.ttft = Histogram(
            "bandmaster_router_ttft_seconds",
            "Time to first token of streamed turns (dispatch to the worker's first chunk), by traffic",
            ("traffic",),
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
            registry=r,
        )
        self.batch_api = Counter(
            "bandmaster_router_batch_api_requests",
            "Batch API calls forwarded to the batch service (/v1/files*, /v1/batches*) by status "
            "(not counted in bandmaster_router_requests: they are not inference)",
            ("status",),
            registry=r,
        )
        self.picks = Counter("bandmaster_router_picks", "Worker selections by reason", ("reason",), registry=r)
        self.prompts = Counter(
            "bandmaster_router_prompts",
            "Turns by how their prompt was hashed: tokens (exact), text (approximate), "
            "text_fallback (a tokenizer is configured but the chat template failed)",
            ("mode",),
            registry=r,
        )
        self.predicted_cached_tokens = Counter(
            "bandmaster_router_predicted_cached_tokens",
            "Prompt tokens the chosen worker holds according to the router's prefix index (compare with the "
            "workers' cached_tokens)",
            registry=r,
        )
        self.retries = Counter(
            "bandmaster_router_retries", "Turns retried on another worker before the first token", registry=r
        )
        self.admission_fast_path = Counter(
            "bandmaster_router_admission_fast_path",
            "Turns started on their program's cached admission, their Admit sent in the background "
            "(--admission-fast-path)",
            registry=r,
        )
        self.upstream_errors = Counter(
            "bandmaster_router_upstream_errors", "Worker failures by kind and phase", ("kind", "phase"), registry=r
        )
        self.fail_open = Counter(
            "bandmaster_router_scheduler_fail_open",
            "Turns routed without admission, by why: unreachable, no_answer (nothing within "
            "the decision deadline), hold_overrun, outage (known down: not asked), error",
            ("reason",),
            registry=r,
        )
        self.admit_deadline_extended = Counter(
            "bandmaster_router_admit_deadline_extended",
            "Admit decision windows that ran past their wall-clock length because the router's own event loop "
            "ran late in them (the window counts only on-time loop time; see bandmaster_event_loop_lag_seconds)",
            registry=r,
        )
        self.scheduler_errors = Counter(
            "bandmaster_router_scheduler_errors", "Failed scheduler calls by method", ("method",), registry=r
        )
        self.admit_wait = Histogram(
            "bandmaster_router_admit_wait_seconds",
            "Time a turn waited in Admit",
            buckets=(0.001, 0.01, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 300, 1800),
            registry=r,
        )
        self.kv_events = Counter(
            "bandmaster_router_kv_events", "KV events applied to the index, by outcome", ("outcome",), registry=r
        )
        self.workers = Gauge("bandmaster_router_workers", "Healthy workers known from the capacity service", registry=r)
        self.capacity_connected = Gauge(
            "bandmaster_router_capacity_connected", "1 while the capacity watch stream is open", registry=r
        )
        self.replica_sync_peers = Gauge(
            "bandmaster_router_replica_sync_peers",
            "Other routers whose active load this router adds to its own (--router-replica-sync; 0 when off "
            "or when the peer view went stale)",
            registry=r,
        )
        self.replica_sync_age = Gauge(
            "bandmaster_router_replica_sync_age_seconds",
            "Age of the peer-load table in use (--router-replica-sync; -1 when none is held)",
            registry=r,
        )
        self.replica_sync_peer_requests = Gauge(
            "bandmaster_router_replica_sync_peer_requests",
            "In-flight requests the other routers report on each worker (--router-replica-sync), added to this "
            "router's own count when it picks",
            ["worker_id"],
            registry=r,
        )
        self.replica_sync_reports = Counter(
            "bandmaster_router_replica_sync_reports",
            "Load reports sent to the capacity service by outcome (sent, failed)",
            ["outcome"],
            registry=r,
        )
        self.circuit_transitions = Counter(
            "bandmaster_router_worker_circuit_transitions",
            "Worker circuit-breaker transitions by new state (open = out of rotation, half_open = probing, "
            "closed = back) and reason",
            ("state", "reason"),
            registry=r,
        )
        self.workers_out_of_rotation = Gauge(
            "bandmaster_router_workers_out_of_rotation",
            "Workers taken out of rotation by their circuit breaker",
            registry=r,
        )
        self.client_limited = Counter(
            "bandmaster_router_client_limited",
            "New programs refused with 429 by reason (too_many_programs, new_program_rate)",
            ("reason",),
            registry=r,
        )
        self.http_connections = Gauge(
            "bandmaster_router_http_connections", "Open client connections on the HTTP port", registry=r
        )
        self.http_connections_refused = Counter(
            "bandmaster_router_http_connections_refused",
            "Client connections refused at the connection cap (503)",
            registry=r,
        )
        self.http_connection_shares = Counter(
            "bandmaster_router_http_connection_shares",
            "Connections acted on to share the HTTP port between clients: refused_client_cap (the client held "
            "--http-max-connections-per-client; also counted in http_connections_refused), evicted_idle (an idle "
            "connection of the client holding the most, closed at the port's cap for another client's)",
            ("action",),
            registry=r,
        )
        self.http_timeouts = Counter(
            "bandmaster_router_http_timeouts",
            "Client connections closed for slowness, by phase (header, body)",
            ("phase",),
            registry=r,
        )
        self.scheduler_reachable = Gauge(
            "bandmaster_router_scheduler_reachable", "0 while the router fails open", registry=r
        )
        self.scheduler_reachable.set(1)
        self._children: dict[tuple, object] = {}

    def request(self, route: str, path: str, outcome: str, traffic: str = "online"):
        """The `requests` child of these labels, looked up once (labels() validates and locks each call)."""
        return self._child(self.requests, route, path, outcome, traffic)

    def time_to_first_token(self, traffic: str):
        return self._child(self.ttft, traffic)

    def flight(self, traffic: str):
        return self._child(self.in_flight, traffic)

    def pick(self, reason: str):
        return self._child(self.picks, reason)

    def prompt(self, mode: str):
        return self._child(self.prompts, mode)

    def _child(self, metric, *labels: str):
        key = (metric, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child
