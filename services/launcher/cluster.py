"""The embedded local cluster: which processes `bandmaster up` starts, in which order, with which flags."""

from __future__ import annotations

import json
import logging
import socket
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from services.common.auth.certs import LocalPki, ensure_local_pki
from services.common.serve.ports import DEFAULT_PORTS
from services.common.settings.config import require
from services.launcher.supervisor import Child, ChildSpec, Supervisor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClusterPorts:
    """Where the cluster's processes listen on loopback; 0 = any free port. The default (all 0) suits
    tests, benchmarks and the demo, which may run several clusters at once; `bandmaster up` uses `fixed()`,
    the documented ports, so that clients and `bandmaster programs/plan/status` find it without flags.
    The router's HTTP port is `ClusterConfig.http_port`."""

    capacity: int = 0
    scheduler: int = 0
    router: int = 0
    """The router's gRPC port (Router.Generate / Release)."""
    planner: int = 0
    batch: int = 0
    """The batch service's gRPC port (health)."""
    batch_http: int = 0
    """The batch service's Batch API (the router forwards /v1/files*, /v1/batches* there)."""
    capacity_metrics: int = 0
    scheduler_metrics: int = 0
    router_metrics: int = 0
    planner_metrics: int = 0
    batch_metrics: int = 0
    first_worker: int = 0
    """Simulated worker i listens on first_worker + i (0 = each on any free port)."""

    @classmethod
    def fixed(cls) -> "ClusterPorts":
        d = DEFAULT_PORTS
        return cls(
            capacity=d["capacity"],
            scheduler=d["scheduler"],
            router=d["router"],
            planner=d["planner"],
            batch=d["batch"],
            batch_http=d["batch_http"],
            capacity_metrics=d["capacity_metrics"],
            scheduler_metrics=d["scheduler_metrics"],
            router_metrics=d["router_metrics"],
            planner_metrics=d["planner_metrics"],
            batch_metrics=d["batch_metrics"],
            first_worker=d["simworker"],
        )

    def worker(self, index: int) -> int:
        return self.first_worker + index if self.first_worker else 0

    def scheduler_replica(self, index: int) -> int:
        """Scheduler replica i's gRPC port: the scheduler port + 10 i (0 = any free port)."""
        return self.scheduler + 10 * index if self.scheduler else 0

    def scheduler_metrics_replica(self, index: int) -> int:
        return self.scheduler_metrics + 10 * index if self.scheduler_metrics else 0


PORT_LABELS = {
    "capacity": "capacity gRPC",
    "scheduler": "scheduler gRPC",
    "router": "router gRPC",
    "planner": "planner gRPC",
    "batch": "batch service gRPC",
    "batch_http": "batch service Batch API HTTP",
    "capacity_metrics": "capacity /metrics",
    "scheduler_metrics": "scheduler /metrics",
    "router_metrics": "router /metrics",
    "planner_metrics": "planner /metrics",
    "batch_metrics": "batch service /metrics",
    "http": "router HTTP",
    "first_worker": "simulated worker",
}


@dataclass(frozen=True)
class ClusterConfig:
    """What `bandmaster up` starts. Validated like every service config: a violation names the rule."""

    workers: int = 2
    """Simulated SGLang workers to start (ignored when `worker_urls` names real servers)."""
    worker_urls: tuple[str, ...] = ()
    worker_kv_tokens: int = 65_536
    worker_host_kv_tokens: int = 0
    worker_page_size: int = 16
    worker_speedup: float = 1.0
    worker_timing_profile: str = "glm45-fp8-h200"
    worker_cache_report: bool = True
    """Start the simulated workers with `--enable-cache-report` (as docs/getting-started.md runs SGLang);
    off models workers whose completions carry no cached-token counts."""
    model_name: str = "bandmaster-sim"
    poll_interval_seconds: float = 1.0
    http_port: int = 8000
    """The router's OpenAI/SGLang HTTP port (0 = any free port)."""
    scheduler: bool = True
    """Start the program scheduler; off = KV-aware routing only."""
    scheduler_args: tuple[str, ...] = ()
    """Extra scheduler flags (e.g. --pause-threshold 0.9), appended last so they win."""
    scheduler_replicas: int = 1
    """Scheduler processes. More than one: active/standby with leader election, sharing
    `<state dir>/scheduler-state.sqlite` (or the Redis a `--state-redis-url` scheduler arg names); replica i
    listens on the scheduler ports + 10 i; the router and the planner are given every address
    (docs/scheduler-failover.md)."""
    router_processes: int = 1
    """Router processes sharing the router's ports (`python -m services.router --processes N`): more
    than one lets the data plane use more than one core (docs/router.md)."""
    router_args: tuple[str, ...] = ()
    """Extra router flags (e.g. --seed 0 for reproducible tie-breaks), appended last so they win."""
    tokenizer: str = ""
    """The model's tokenizer directory, given to the router and the simulated workers: prompts are then
    routed on exact token pages and KV events are used. Empty = approximate text routing, no KV events."""
    state_dir: Path | None = None
    scheduler_state: bool = False
    """Keep the scheduler's program table in `<state dir>/scheduler-state.sqlite`, recovered when the
    cluster starts again on the same state dir (`bandmaster up`); off = in memory (demo, benchmarks:
    every run starts from an empty table)."""
    log_level: str = "INFO"
    trace: bool = False
    """Every service process writes the spans of turns to `<trace_dir>/<name>.jsonl` (`--trace-file`), which
    `bandmaster trace` reads."""
    trace_dir: Path | None = None
    """Where the span files go with `trace`; None = `<state dir>/traces`."""
    trace_background: bool = False
    """With `trace`: background spans too (`--trace-background`)."""
    extra_worker_args: tuple[str, ...] = field(default_factory=tuple)
    secure: bool = False
    """Mutual TLS on every gRPC port, HTTPS on the router's, control and data bearer tokens: a local CA,
    certificates and tokens are made in `<state dir>/secure/` (docs/security.md)."""
    planner: bool = False
    """Start the planner (batch job demand, drain leases, replica targets) after the router, then the batch
    service (the Batch API and its dispatcher, paced by the planner's lease), to which the router forwards
    `/v1/files*` and `/v1/batches*` (`bandmaster up` turns both on; `--no-planner` off)."""
    planner_connector: str = "virtual"
    """`virtual`: the fleet is the `workers` simulated workers this command starts, fixed (the planner's
    replica targets are recorded, nothing is started); `local`: the planner owns the simulated workers,
    starting `workers` of them as its idle target and up to `planner_max_replicas` for batch work."""
    planner_max_replicas: int = 0
    """Most workers the `local` connector runs (0 = workers + 2)."""
    planner_args: tuple[str, ...] = ()
    """Extra planner flags, appended last so they win."""
    worker_api_key: str = field(default="", repr=False)
    """The API key the workers require (SGLang's `--api-key`; `bandmaster up --worker-api-key`): given to the
    capacity service and the router in their environment (never on a command line), and to the simulated
    workers, which then require it too. Empty = none."""
    worker_ca_file: str = ""
    """PEM CA bundle that https workers are verified against (empty = the system roots)."""
    ports: ClusterPorts = field(default_factory=ClusterPorts)
    """The gRPC, metrics, Batch API and simulated worker ports (default: any free ones)."""

    def planned_ports(self) -> list[tuple[str, int]]:
        """(which, port) of every fixed port this cluster will bind, `which` a ClusterPorts field, `http`
        or `first_worker` for each simulated worker; ports left to the system (0) are not listed."""
        wanted = [
            ("capacity", self.ports.capacity),
            ("capacity_metrics", self.ports.capacity_metrics),
            ("router", self.ports.router),
            ("router_metrics", self.ports.router_metrics),
            ("http", self.http_port),
        ]
        if self.scheduler:
            for i in range(self.scheduler_replicas):
                wanted += [
                    ("scheduler", self.ports.scheduler_replica(i)),
                    ("scheduler_metrics", self.ports.scheduler_metrics_replica(i)),
                ]
        if self.planner:
            wanted += [
                ("planner", self.ports.planner),
                ("planner_metrics", self.ports.planner_metrics),
                ("batch", self.ports.batch),
                ("batch_metrics", self.ports.batch_metrics),
                ("batch_http", self.ports.batch_http),
            ]
        if not self.worker_urls and not (self.planner and self.planner_connector == "local"):
            wanted += [("first_worker", self.ports.worker(i)) for i in range(self.workers)]
        return [(which, port) for which, port in wanted if port]

    def __post_init__(self) -> None:
        require(
            bool(self.worker_urls) or self.workers >= 1,
            "workers",
            self.workers,
            "workers >= 1 unless --worker-url is given",
        )
        require(0 <= self.workers <= 64, "workers", self.workers, "0 <= workers <= 64")
        require(
            self.worker_kv_tokens >= self.worker_page_size,
            "worker_kv_tokens",
            self.worker_kv_tokens,
            "worker_kv_tokens >= worker_page_size",
        )
        require(
            self.worker_host_kv_tokens >= 0,
            "worker_host_kv_tokens",
            self.worker_host_kv_tokens,
            "worker_host_kv_tokens >= 0",
        )
        require(self.worker_page_size >= 1, "worker_page_size", self.worker_page_size, "worker_page_size >= 1")
        require(self.worker_speedup > 0, "worker_speedup", self.worker_speedup, "worker_speedup > 0")
        require(0 <= self.http_port <= 65535, "http_port", self.http_port, "0 <= http_port <= 65535")
        require(
            1 <= self.scheduler_replicas <= 5,
            "scheduler_replicas",
            self.scheduler_replicas,
            "1 <= scheduler_replicas <= 5",
        )
        require(
            1 <= self.router_processes <= 64,
            "router_processes",
            self.router_processes,
            "1 <= router_processes <= 64",
        )
        require(
            self.poll_interval_seconds > 0,
            "poll_interval_seconds",
            self.poll_interval_seconds,
            "poll_interval_seconds > 0",
        )
        require(
            self.planner_connector in ("virtual", "local"),
            "planner_connector",
            self.planner_connector,
            "planner_connector is virtual or local",
        )
        require(
            not (self.planner and self.planner_connector == "local" and self.worker_urls),
            "planner_connector",
            self.planner_connector,
            "the local connector starts simulated workers: not with --worker-url",
        )
        require(
            self.planner_max_replicas == 0 or self.planner_max_replicas >= self.workers,
            "planner_max_replicas",
            self.planner_max_replicas,
            "planner_max_replicas >= workers (0 = workers + 2)",
        )
        for url in self.worker_urls:
            require(
                url.startswith(("http://", "https://")), "worker_url", url, "worker URLs start with http:// or https://"
            )
        for name, port in self.ports.__dict__.items():
            require(0 <= port <= 65535, f"ports.{name}", port, "0 <= port <= 65535")
        taken: dict[int, str] = {}
        for which, port in self.planned_ports():
            require(port <= 65535, which, port, "port <= 65535 (the simulated workers count up from the first)")
            require(port not in taken, which, port, f"each port is used once ({taken.get(port)} has it too)")
            taken[port] = which


@dataclass
class Cluster:
    supervisor: Supervisor
    workers: list[str] = field(default_factory=list)
    capacity: Child | None = None
    scheduler: Child | None = None
    """The first scheduler replica (the only one unless `scheduler_replicas` > 1)."""
    schedulers: list[Child] = field(default_factory=list)
    router: Child | None = None
    planner: Child | None = None
    batch: Child | None = None
    """The batch service (Batch API and dispatcher), started with the planner."""
    pki: LocalPki | None = None
    """The CA, certificates and token files of a secure cluster."""

    @property
    def http_url(self) -> str:
        scheme = "https" if self.pki is not None else "http"
        return f"{scheme}://127.0.0.1:{self.router.ready['http_port']}" if self.router else ""

    def endpoints(self) -> list[tuple[str, str]]:
        rows = [(f"worker[{i}]", url) for i, url in enumerate(self.workers)]
        if self.router is not None:
            rows.append(("router HTTP (OpenAI API)", self.http_url + "/v1"))
        if self.batch is not None:
            rows.append(("batch service Batch API (also via the router)", self.batch.ready.get("http", "") + "/v1"))
        for child in self.supervisor.children:
            if child.spec.kind == "grpc":
                rows.append((child.spec.name, child.endpoint))
                if child.ready.get("metrics_port"):
                    rows.append(
                        (f"{child.spec.name} /metrics", f"http://127.0.0.1:{child.ready['metrics_port']}/metrics")
                    )
        return rows

    @property
    def scheduler_addrs(self) -> str:
        """Every scheduler replica's address, comma-separated (what the router and the planner are given)."""
        return ",".join(child.endpoint for child in self.schedulers)

    def stop(self) -> None:
        self.supervisor.stop_all()


def simworker_spec(config: ClusterConfig, index: int) -> ChildSpec:
    args = [
        "--host",
        "127.0.0.1",
        "--port",
        str(config.ports.worker(index)),
        "--served-model-name",
        config.model_name,
        "--max-total-tokens",
        str(config.worker_kv_tokens),
        "--page-size",
        str(config.worker_page_size),
        "--speedup",
        str(config.worker_speedup),
        "--timing-profile",
        config.worker_timing_profile,
        "--seed",
        str(index),
        *(("--enable-cache-report",) if config.worker_cache_report else ()),
        # As docs/getting-started.md runs SGLang: the scheduler's priorities (a resumed turn first, a
        # soft-demoted program's turns last) only order an engine's queue with this on.
        "--enable-priority-scheduling",
    ]
    if config.tokenizer:
        # Exact token pages on both sides: the router can index the workers' KV events. The publisher
        # binds an ephemeral loopback port, which the router reads from /server_info.
        args += [
            "--tokenizer-path",
            config.tokenizer,
            "--kv-events-config",
            json.dumps({"publisher": "zmq", "endpoint": "tcp://127.0.0.1:*"}),
        ]
    if config.worker_host_kv_tokens:
        # write_back keeps the host tier disjoint from the GPU pool, so the host figure is counted in full.
        args += [
            "--enable-hierarchical-cache",
            "--hicache-write-policy",
            "write_back",
            "--hicache-ratio",
            f"{config.worker_host_kv_tokens / config.worker_kv_tokens:.6f}",
        ]
    return ChildSpec(
        name=f"simworker-{index}",
        module="services.simworker",
        args=[*args, *config.extra_worker_args],
        kind="http",
        env={"SIMWORKER_API_KEY": config.worker_api_key} if config.worker_api_key else {},
    )


def worker_client_env(config: ClusterConfig) -> dict[str, str]:
    """The worker API key of the children that call workers, in their environment (a command line is public)."""
    return {"BANDMASTER_WORKER_API_KEY": config.worker_api_key} if config.worker_api_key else {}


def worker_client_args(config: ClusterConfig) -> list[str]:
    return ["--worker-ca-file", config.worker_ca_file] if config.worker_ca_file else []


def capacity_spec(config: ClusterConfig, worker_urls: list[str]) -> ChildSpec:
    args = [
        "--listen",
        f"127.0.0.1:{config.ports.capacity}",
        "--metrics-port",
        str(config.ports.capacity_metrics),
        "--log-level",
        config.log_level,
        "--poll-interval-seconds",
        str(config.poll_interval_seconds),
        "--poll-timeout-seconds",
        str(min(2.0, config.poll_interval_seconds / 2)),
    ]
    for url in worker_urls:
        args += ["--worker-url", url]
    return ChildSpec(
        name="capacity",
        module="services.capacity",
        args=[*args, *worker_client_args(config)],
        env=worker_client_env(config),
    )


SCHEDULER_STATE_FILE = "scheduler-state.sqlite"


def scheduler_spec(
    config: ClusterConfig, capacity_addr: str, state_dir: Path | None = None, replica: int = 0
) -> ChildSpec:
    """Scheduler replica `replica` (named `scheduler`, then `scheduler-1`, ...). With several replicas
    each runs with `--leader-election` on the shared state file."""
    replicated = config.scheduler_replicas > 1
    # The control loop's time constants are in wall seconds; simulated workers run `speedup` times
    # faster than the hardware they model, so the loop runs that much faster too.
    speedup = config.worker_speedup if not config.worker_urls else 1.0
    args = [
        "--capacity-addr",
        capacity_addr,
        "--listen",
        f"127.0.0.1:{config.ports.scheduler_replica(replica)}",
        "--metrics-port",
        str(config.ports.scheduler_metrics_replica(replica)),
        "--log-level",
        config.log_level,
        "--scheduler-interval-seconds",
        f"{max(0.05, 5.0 / speedup):g}",
        "--acting-decay-tau-seconds",
        f"{1.0 / speedup:g}",
        "--resume-timeout-seconds",
        f"{1800.0 / speedup:g}",
        "--program-idle-ttl-seconds",
        f"{900.0 / speedup:g}",
        "--resume-aging-seconds",
        f"{300.0 / speedup:g}",
        # The cost-aware policy's priors are in the modelled hardware's seconds; what it observes
        # (tool times, time to first token) arrives in wall seconds, S times shorter.
        "--cost-aware-tool-seconds",
        f"{2.0 / speedup:g}",
        "--cost-aware-prefill-tokens-per-s",
        f"{18_000.0 * speedup:g}",
        # Without a tokenizer, chat prompts reach the router as text and it matches prefixes on text
        # chunks (approximate mode), which KV events cannot match. See docs/router-selection.md.
        *([] if config.tokenizer else ["--no-use-kv-events"]),
        "--state-path",
        str(state_dir / SCHEDULER_STATE_FILE) if (config.scheduler_state or replicated) and state_dir else "none",
        *(["--leader-election"] if replicated else []),
        *config.scheduler_args,
    ]
    return ChildSpec(name=f"scheduler-{replica}" if replica else "scheduler", module="services.scheduler", args=args)


def router_spec(
    config: ClusterConfig, capacity_addr: str, scheduler_addr: str | None, batch_url: str = ""
) -> ChildSpec:
    args = [
        "--capacity-addr",
        capacity_addr,
        "--listen",
        f"127.0.0.1:{config.ports.router}",
        "--metrics-port",
        str(config.ports.router_metrics),
        "--http-port",
        str(config.http_port),
        "--log-level",
        config.log_level,
    ]
    if batch_url:
        args += ["--batch-url", batch_url]
    if config.router_processes > 1:
        # One router to its clients: each process adds the others' in-flight load to its own.
        args += ["--processes", str(config.router_processes), "--router-replica-sync"]
    if config.tokenizer:
        args += ["--tokenizer", config.tokenizer]
    if scheduler_addr:
        args += ["--scheduler-addr", scheduler_addr]
    else:
        args += ["--no-scheduler", "--use-kv-events" if config.tokenizer else "--no-use-kv-events"]
    # Its gRPC health follows the fleet (NOT_SERVING while no worker is healthy): ready once it answers.
    return ChildSpec(
        name="router",
        module="services.router",
        args=[*args, *worker_client_args(config), *config.router_args],
        env=worker_client_env(config),
        serving_means_ready=False,
    )


PLANNER_REGISTRY_FILE = "planner.sqlite3"
"""The planner's job store: ids, counts and deadlines of batch jobs (no request content)."""
BATCH_REGISTRY_FILE = "batch.sqlite3"
"""The batch service's registry: input files, batches, per-request state and results."""


def local_worker_args(config: ClusterConfig) -> list[str]:
    """The flags of a simulated worker the planner's local connector starts: those of `simworker_spec`
    but the port (the connector gives `--port 0` and a ready file) and the seed."""
    args = list(simworker_spec(config, 0).args)
    for flag in ("--port", "--seed"):
        i = args.index(flag)
        del args[i : i + 2]
    return args


def planner_spec(
    config: ClusterConfig,
    capacity_addr: str,
    scheduler_addr: str | None,
    router_metrics_url: str,
    state_dir: Path,
) -> ChildSpec:
    """The planner after the router, reading online traffic from the router's /metrics. Control only: the
    batch service (`batch_spec`) carries the batch requests."""
    speedup = config.worker_speedup if not config.worker_urls else 1.0
    args = [
        "--listen",
        f"127.0.0.1:{config.ports.planner}",
        "--metrics-port",
        str(config.ports.planner_metrics),
        "--registry-path",
        str(state_dir / PLANNER_REGISTRY_FILE),
        "--capacity",
        capacity_addr,
        "--router-metrics-url",
        router_metrics_url,
        "--log-level",
        config.log_level,
        # Decisions follow the simulated clock like the scheduler's loop; a tick stays >= 0.2 s.
        "--tick-interval-seconds",
        f"{max(0.2, 5.0 / speedup):g}",
        "--cold-start-margin-seconds",
        f"{30.0 / speedup:g}",
    ]
    if scheduler_addr:
        args += ["--scheduler", scheduler_addr]
    workers = len(config.worker_urls) or config.workers
    if config.planner_connector == "local":
        top = config.planner_max_replicas or workers + 2
        args += [
            "--connector",
            "local",
            "--min-replicas",
            str(workers),
            "--max-replicas",
            str(top),
            "--local-max-workers",
            str(top),
            *(f"--local-worker-arg={a}" for a in local_worker_args(config)),
        ]
    else:
        args += [
            "--connector",
            "virtual",
            "--virtual-initial-replicas",
            str(workers),
            "--min-replicas",
            str(workers),
            "--max-replicas",
            str(workers),
        ]
    return ChildSpec(name="planner", module="services.planner", args=[*args, *config.planner_args])


def batch_spec(config: ClusterConfig, planner_addr: str, router_url: str, http_port: int, state_dir: Path) -> ChildSpec:
    """The batch service after the planner: its Batch API on `http_port` (the router forwards there), its
    requests sent through the router at the rate of the planner's lease, its progress reported to the planner."""
    args = [
        "--listen",
        f"127.0.0.1:{config.ports.batch}",
        "--metrics-port",
        str(config.ports.batch_metrics),
        "--http-listen",
        f"127.0.0.1:{http_port}",
        "--registry-path",
        str(state_dir / BATCH_REGISTRY_FILE),
        "--planner",
        planner_addr,
        "--dispatch-url",
        router_url,
        "--log-level",
        config.log_level,
    ]
    return ChildSpec(name="batch", module="services.batch", args=args)


def free_loopback_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


SECURE_DIR = "secure"
SECURE_NAMES = ("capacity", "scheduler", "router", "planner", "batch", "client")
"""Who gets a certificate: each control-plane service, and `client` for the supervisor's health probes,
the CLI and the user's own gRPC clients."""


def secure_cluster(supervisor: Supervisor) -> LocalPki:
    """Make (or reuse) the local CA and tokens, issue the certificates, and give the supervisor's
    health probes the client certificate."""
    pki = ensure_local_pki(supervisor.state_dir / SECURE_DIR, SECURE_NAMES)
    supervisor.grpc_credentials = grpc.ssl_channel_credentials(
        root_certificates=pki.ca.read_bytes(),
        private_key=pki.key("client").read_bytes(),
        certificate_chain=pki.cert("client").read_bytes(),
    )
    return pki


def _secured(spec: ChildSpec, pki: LocalPki | None) -> ChildSpec:
    if pki is None:
        return spec
    return ChildSpec(
        spec.name,
        spec.module,
        [*pki.service_args(spec.name.partition("-")[0]), *spec.args],
        spec.kind,
        spec.env,
        spec.serving_means_ready,
    )


def start_cluster(config: ClusterConfig, supervisor: Supervisor | None = None) -> Cluster:
    """Start workers (unless real URLs are given), then the control plane; raise StartupError on failure."""
    supervisor = supervisor or Supervisor(config.state_dir)
    if config.trace:
        supervisor.trace_dir = Path(config.trace_dir or supervisor.state_dir / "traces").absolute()
        supervisor.trace_background = config.trace_background
    cluster = Cluster(supervisor)
    try:
        pki = cluster.pki = secure_cluster(supervisor) if config.secure else None
        planner_owns_workers = config.planner and config.planner_connector == "local"
        if config.worker_urls:
            cluster.workers = list(config.worker_urls)
        elif planner_owns_workers:
            cluster.workers = []  # the planner starts them and registers them with the capacity service
        else:
            started = supervisor.start_all([simworker_spec(config, i) for i in range(config.workers)])
            cluster.workers = [child.endpoint for child in started]
        (cluster.capacity,) = supervisor.start_all([_secured(capacity_spec(config, cluster.workers), pki)])
        scheduler_addr = None
        if config.scheduler:
            cluster.schedulers = supervisor.start_all(
                [
                    _secured(scheduler_spec(config, cluster.capacity.endpoint, supervisor.state_dir, i), pki)
                    for i in range(config.scheduler_replicas)
                ]
            )
            cluster.scheduler = cluster.schedulers[0]
            scheduler_addr = cluster.scheduler_addrs
        # The router forwards the Batch API to the batch service, which starts after it (it dispatches through
        # the router) and after the planner (whose lease it follows): its HTTP port is chosen first so that
        # the router is told it.
        batch_port = (config.ports.batch_http or free_loopback_port()) if config.planner else 0
        scheme = "https" if pki is not None else "http"
        batch_url = f"{scheme}://127.0.0.1:{batch_port}" if config.planner else ""
        (cluster.router,) = supervisor.start_all(
            [_secured(router_spec(config, cluster.capacity.endpoint, scheduler_addr, batch_url), pki)]
        )
        if config.planner:
            spec = planner_spec(
                config,
                cluster.capacity.endpoint,
                scheduler_addr,
                f"http://127.0.0.1:{cluster.router.ready['metrics_port']}",
                supervisor.state_dir,
            )
            (cluster.planner,) = supervisor.start_all([_secured(spec, pki)])
            batch = batch_spec(config, cluster.planner.endpoint, cluster.http_url, batch_port, supervisor.state_dir)
            (cluster.batch,) = supervisor.start_all([_secured(batch, pki)])
    except BaseException:
        supervisor.stop_all()
        raise
    return cluster
