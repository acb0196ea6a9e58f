"""`bandmaster up`: the embedded local cluster, in the foreground until Ctrl-C or SIGTERM.

It listens on the documented fixed ports (each with a flag; `--ports auto` takes any free ones), checks
them before starting anything, says loudly when no worker is healthy (and fails then with
`--require-healthy`, the default with `--worker-url`), prints every endpoint, and registers itself under a
name (`--name`, else default, default-2, ...) in the per-user cluster registry and in its state dir
(services/cli/endpoints.py), where `bandmaster programs / plan / status / batch / trace` find it; both
records are removed on exit. A state dir it made itself (no `--state-dir`) is removed on a clean stop
unless `--keep-state` is given or traces were written into it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import grpc

from bandmaster.capacity.v1 import capacity_pb2, capacity_pb2_grpc
from services.cli import endpoints
from services.cli.status import degraded_banner
from services.common.auth.security import load_secret_file
from services.common.observe.logs import setup_logging
from services.common.serve.ports import DEFAULT_PORTS, port_free
from services.common.settings.errors import ConfigError
from services.common.sglang.worker_client import WORKER_API_KEY_ENV, check_api_key
from services.launcher.cluster import PORT_LABELS, Cluster, ClusterConfig, ClusterPorts, start_cluster
from services.launcher.supervisor import ChildSpec, StartupError
from services.launcher.table import render_table

PORT_FLAGS = {
    "capacity": "--capacity-port",
    "scheduler": "--scheduler-port",
    "router": "--router-port",
    "planner": "--planner-port",
    "batch": "--batch-port",
    "batch_http": "--batch-http-port",
    "capacity_metrics": "--capacity-metrics-port",
    "scheduler_metrics": "--scheduler-metrics-port",
    "router_metrics": "--router-metrics-port",
    "planner_metrics": "--planner-metrics-port",
    "batch_metrics": "--batch-metrics-port",
    "first_worker": "--worker-port",
    "http": "--http-port",
}
"""The `bandmaster up` flag of each ClusterPorts field (and of the router's HTTP port)."""
_DEFAULT_OF = {"first_worker": "simworker", "http": "router_http"}
PORT_BASE_OFFSETS = {
    "http": 0,
    "capacity": 1,
    "scheduler": 2,
    "router": 3,
    "planner": 4,
    "batch": 5,
    "batch_http": 6,
    "capacity_metrics": 7,
    "scheduler_metrics": 8,
    "router_metrics": 9,
    "planner_metrics": 10,
    "batch_metrics": 11,
    "first_worker": 50,
}
"""`--port-base P`: each port is P + its offset. Scheduler replica i adds 10 i to the scheduler's two
(P+12 and P+18, ... P+42 and P+48 for the fifth), so the simulated workers start at P+50."""


def add_cluster_arguments(parser: argparse.ArgumentParser, *, workers_default: int = 2) -> None:
    parser.add_argument("--workers", type=int, default=workers_default, help="simulated SGLang workers to start")
    parser.add_argument(
        "--worker-url",
        action="append",
        default=[],
        dest="worker_urls",
        help="a real SGLang server URL (repeatable); no simulated workers are started then",
    )
    parser.add_argument("--worker-kv-tokens", type=int, default=65_536, help="GPU KV pool of each simulated worker")
    parser.add_argument(
        "--worker-host-kv-tokens",
        type=int,
        default=0,
        help="HiCache host tier of each simulated worker, in tokens (0 = off)",
    )
    parser.add_argument("--worker-page-size", type=int, default=16, help="KV page size of each simulated worker")
    parser.add_argument(
        "--worker-cache-report",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="start the simulated workers with --enable-cache-report, as docs/getting-started.md starts "
        "SGLang; --no-worker-cache-report models workers without it (capacity then warns, and the "
        "cost-aware policy keeps its prior prefill rate)",
    )
    parser.add_argument(
        "--speedup",
        type=float,
        default=1.0,
        dest="worker_speedup",
        help="simulated workers run this many times faster than the real hardware",
    )
    parser.add_argument(
        "--timing-profile",
        default="glm45-fp8-h200",
        dest="worker_timing_profile",
        help="the hardware and model the simulated workers' timing models (docs/simworker.md)",
    )
    parser.add_argument("--model-name", default="bandmaster-sim", help="the model name the simulated workers serve")
    parser.add_argument(
        "--tokenizer",
        default="",
        help="the model's tokenizer directory (tokenizer.json + tokenizer_config.json) for the router "
        "and the simulated workers: exact token routing with KV events (default: text routing)",
    )
    parser.add_argument(
        "--http-port",
        type=int,
        default=None,
        metavar="PORT",
        help=f"the router's OpenAI/SGLang HTTP port (default: {DEFAULT_PORTS['router_http']}; 0 = any free port)",
    )
    parser.add_argument(
        "--no-scheduler", action="store_true", help="start no program scheduler: the router does KV-aware routing only"
    )
    parser.add_argument(
        "--scheduler-arg",
        action="append",
        default=[],
        dest="scheduler_args",
        help="extra flag for the scheduler, e.g. --scheduler-arg=--pause-threshold=0.9 (repeatable)",
    )
    parser.add_argument(
        "--scheduler-replicas",
        type=int,
        default=1,
        metavar="N",
        help="scheduler processes, active/standby (default: 1): with 2 or more, leadership is a lease in the "
        "shared state store, the router and the planner follow the leader, and a replica that dies is "
        "started again as a standby; replica i listens on --scheduler-port + 10 i "
        "(docs/scheduler-failover.md)",
    )
    parser.add_argument(
        "--router-processes",
        type=int,
        default=1,
        metavar="N",
        help="router processes sharing its HTTP and gRPC ports, one core each (default: 1); each keeps its "
        "own worker view and KV index, and they share their in-flight load (--router-replica-sync; docs/router.md)",
    )
    parser.add_argument(
        "--router-arg",
        action="append",
        default=[],
        dest="router_args",
        help="extra flag for the router, e.g. --router-arg=--seed=0 (repeatable)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="where child logs and ready files go; `bandmaster up` also keeps the scheduler's program "
        "table there (scheduler-state.sqlite), recovered when it is started again with it",
    )
    parser.add_argument("--log-level", default="INFO", help="log level of every child process")
    parser.add_argument(
        "--trace-dir",
        nargs="?",
        const="",
        default=None,
        help="write every process's turn spans to DIR/<process>.jsonl (no collector needed; read them with "
        "`bandmaster trace`); without DIR: <state dir>/traces",
    )
    parser.add_argument(
        "--trace-background",
        action="store_true",
        help="with --trace-dir, also write background spans (control ticks, recomputes, lease renewals)",
    )


def cluster_config(args: argparse.Namespace, **overrides) -> ClusterConfig:
    values = dict(
        workers=args.workers,
        worker_urls=tuple(args.worker_urls),
        worker_kv_tokens=args.worker_kv_tokens,
        worker_host_kv_tokens=args.worker_host_kv_tokens,
        worker_page_size=args.worker_page_size,
        worker_cache_report=args.worker_cache_report,
        worker_speedup=args.worker_speedup,
        worker_timing_profile=args.worker_timing_profile,
        model_name=args.model_name,
        state_dir=args.state_dir,
        log_level=args.log_level.upper(),
        trace=getattr(args, "trace_dir", None) is not None,
        trace_dir=Path(args.trace_dir) if getattr(args, "trace_dir", None) else None,
        trace_background=getattr(args, "trace_background", False),
        http_port=DEFAULT_PORTS["router_http"] if args.http_port is None else args.http_port,
        scheduler=not args.no_scheduler,
        scheduler_args=tuple(args.scheduler_args),
        scheduler_replicas=getattr(args, "scheduler_replicas", 1),
        router_args=tuple(args.router_args),
        router_processes=getattr(args, "router_processes", 1),
        tokenizer=os.path.abspath(args.tokenizer) if args.tokenizer else "",  # the children run elsewhere
        secure=getattr(args, "secure", False),
        **worker_client_values(args, os.environ),
    )
    values.update(overrides)
    return ClusterConfig(**values)


def add_port_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ports",
        choices=("fixed", "auto"),
        default="fixed",
        help="fixed: the documented ports below; auto: any free port for every one not given by "
        "its flag (several clusters at once, tests)",
    )
    parser.add_argument(
        "--port-base",
        type=int,
        default=None,
        metavar="PORT",
        help="every port not given by its flag in a block from PORT: router HTTP PORT, capacity +1, "
        "scheduler +2, router gRPC +3, planner +4, batch service +5, its Batch API +6, /metrics +7..+11 "
        "(capacity, scheduler, router, planner, batch service), scheduler replica i +10 i, simulated "
        "workers from +50",
    )
    for which, flag in PORT_FLAGS.items():
        if which == "http":
            continue  # declared with the other cluster arguments
        port = DEFAULT_PORTS[_DEFAULT_OF.get(which, which)]
        what = PORT_LABELS[which] + (" (the next ones count up from it)" if which == "first_worker" else "")
        parser.add_argument(
            flag,
            type=int,
            default=None,
            dest=f"port_{which}",
            metavar="PORT",
            help=f"{what} port (default: {port}; 0 = any free port)",
        )


def _fallback_port(args: argparse.Namespace, which: str) -> int:
    """The port of `which` when its flag is not given: from --port-base, 0 with --ports auto, else the
    documented default."""
    base = getattr(args, "port_base", None)
    if base is not None:
        if args.ports == "auto":
            raise ConfigError("port_base", base, "give --port-base or --ports auto, not both")
        if not 1 <= base <= 65535 - PORT_BASE_OFFSETS["first_worker"]:
            raise ConfigError("port_base", base, f"1 <= port_base <= {65535 - PORT_BASE_OFFSETS['first_worker']}")
        return base + PORT_BASE_OFFSETS[which]
    if args.ports == "auto":
        return 0
    return DEFAULT_PORTS[_DEFAULT_OF.get(which, which)]


def cluster_ports(args: argparse.Namespace) -> ClusterPorts:
    """The ports of `bandmaster up`: each flag given wins; the others come from `--port-base`, are 0 (any
    free port) with `--ports auto`, else the documented defaults."""
    values = {}
    for which in PORT_FLAGS:
        if which == "http":
            continue
        given = getattr(args, f"port_{which}")
        values[which] = _fallback_port(args, which) if given is None else given
    return ClusterPorts(**values)


def http_port(args: argparse.Namespace) -> int:
    """The router's HTTP port: --http-port, else as the others (`_fallback_port`)."""
    return _fallback_port(args, "http") if args.http_port is None else args.http_port


def busy_ports(config: ClusterConfig) -> list[tuple[int, str]]:
    """(port, message) of each fixed port that another process holds, the message naming the port and the
    flag that moves it."""
    lines = []
    seen_worker = 0
    for which, port in config.planned_ports():
        label = PORT_LABELS[which]
        if which == "first_worker":
            label = f"simulated worker {seen_worker}"
            seen_worker += 1
        if not port_free("127.0.0.1", port):
            lines.append(
                (
                    port,
                    f"port {port} ({label}) is already in use; choose another with "
                    f"{PORT_FLAGS[which]} (or --ports auto)",
                )
            )
    return lines


def add_parser(commands) -> None:
    parser = commands.add_parser("up", help="start the local cluster in the foreground (Ctrl-C stops it)")
    add_cluster_arguments(parser)
    add_port_arguments(parser)
    parser.add_argument(
        "--require-healthy",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="fail (exit 1, naming each worker and its error) unless a worker is healthy within "
        "--healthy-timeout-seconds (default: on with --worker-url, off for simulated workers, "
        "where no healthy worker is a loud warning)",
    )
    parser.add_argument(
        "--healthy-timeout-seconds",
        type=float,
        default=60.0,
        help="how long to wait for every worker to become healthy before reporting",
    )
    parser.add_argument(
        "--name",
        default="",
        help="the cluster's name, which `bandmaster status / programs / plan / batch --cluster NAME` take "
        f"(default: {endpoints.DEFAULT_NAME}, or {endpoints.DEFAULT_NAME}-2, -3, ... when a running cluster "
        f"has it); it is registered in ${endpoints.CLUSTERS_DIR_ENV}, else $XDG_RUNTIME_DIR/bandmaster/clusters, "
        "else ~/.bandmaster/clusters, while the cluster runs",
    )
    parser.add_argument(
        "--keep-state",
        action="store_true",
        help="keep the temporary state dir (logs, ready files, the scheduler's table) after a clean stop; "
        "without --state-dir it is otherwise removed then (a state dir you name is always kept, and so is "
        "one after a failure, for its logs)",
    )
    parser.add_argument(
        "--secure",
        action="store_true",
        help="mutual TLS on every gRPC port, HTTPS and a bearer token on the router's HTTP API, a "
        "control token on control RPCs: a local CA, certificates and tokens are made in "
        "<state dir>/secure/ (reused when it already holds them); see docs/security.md",
    )
    add_worker_client_arguments(parser)
    parser.add_argument(
        "--no-planner",
        action="store_true",
        help="start no planner and no batch service: no Batch API (/v1/files, /v1/batches answer 404 "
        "batch_not_configured), no drain leases",
    )
    parser.add_argument(
        "--planner-connector",
        choices=("virtual", "local"),
        default="virtual",
        help="virtual (default): the planner sees the --workers simulated workers as a fixed fleet; "
        "local: the planner starts and stops the simulated workers itself (--workers as its idle "
        "target, more for batch work, up to --planner-max-replicas)",
    )
    parser.add_argument(
        "--planner-max-replicas",
        type=int,
        default=0,
        help="most workers the local connector runs (default: --workers + 2)",
    )
    parser.add_argument(
        "--planner-arg",
        action="append",
        default=[],
        dest="planner_args",
        help="extra flag for the planner, e.g. --planner-arg=--safe-rps-per-replica=20 (repeatable)",
    )
    parser.set_defaults(run=run)


def add_worker_client_arguments(parser: argparse.ArgumentParser) -> None:
    """How the cluster reaches its workers: their API key and the CA of https ones (docs/security.md)."""
    parser.add_argument(
        "--worker-api-key",
        default=None,
        metavar="KEY",
        help="the API key the workers were started with (SGLang's --api-key): the capacity service and the "
        "router send it as Authorization: Bearer, given to them in their environment, never on a command line or "
        f"in a log; simulated workers require it too (or env {WORKER_API_KEY_ENV}, or --worker-api-key-file)",
    )
    parser.add_argument(
        "--worker-api-key-file", default=None, metavar="PATH", help="file holding the worker API key (one line)"
    )
    parser.add_argument(
        "--worker-ca-file",
        default="",
        metavar="PATH",
        help="PEM CA bundle that https --worker-url servers are verified against (default: the system roots)",
    )


def worker_client_values(args: argparse.Namespace, env) -> dict:
    """ClusterConfig's worker_api_key and worker_ca_file from the flags, else the environment (a command
    without these flags, e.g. `demo`, gets none). Raises ConfigError naming the flag, never showing the key."""
    if not hasattr(args, "worker_api_key"):
        return {}
    if args.worker_api_key and args.worker_api_key_file:
        raise ConfigError("worker_api_key", "<redacted>", "give --worker-api-key or --worker-api-key-file, not both")
    key = ""
    if args.worker_api_key_file:
        text = load_secret_file("worker_api_key_file", args.worker_api_key_file)
        key = check_api_key("worker_api_key_file", args.worker_api_key_file, text).first
    elif args.worker_api_key:
        key = check_api_key("worker_api_key", "<redacted>", args.worker_api_key).first
    elif env.get(WORKER_API_KEY_ENV, "").strip():
        key = check_api_key(WORKER_API_KEY_ENV, "<redacted>", env[WORKER_API_KEY_ENV]).first
    ca = os.path.abspath(args.worker_ca_file) if args.worker_ca_file else ""  # the children run elsewhere
    if ca and not os.path.isfile(ca):
        raise ConfigError("worker_ca_file", args.worker_ca_file, "cannot read: no such file")
    return {"worker_api_key": key, "worker_ca_file": ca}


def connect_help(cluster: Cluster) -> str:
    """How a client reaches a secure cluster (paths only: a token is never printed)."""
    pki = cluster.pki
    assert pki is not None
    return "\n".join(
        [
            f"secure: mutual TLS on gRPC, HTTPS on {cluster.http_url} (CA {pki.ca})",
            "  a gRPC agent needs the CA, a client certificate and key, and the data token:",
            f"  gRPC client certificate: {pki.cert('client')}  key: {pki.key('client')}",
            f"  data token (HTTP API, Router.Generate/Release): {pki.data_token_file}",
            f"  control token (control RPCs):                   {pki.control_token_file}",
            "  an HTTP client needs the CA and the data token:",
            f'  curl --cacert {pki.ca} -H "Authorization: Bearer $(cat {pki.data_token_file})" '
            f"{cluster.http_url}/v1/models",
            f'  OpenAI(base_url="{cluster.http_url}/v1", api_key=open("{pki.data_token_file}").read().strip(), '
            f'http_client=openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile="{pki.ca}")))',
            f"  bandmaster programs --scheduler-addr "
            f"{cluster.scheduler.endpoint if cluster.scheduler else 'HOST:PORT'} "
            f"--tls-ca {pki.ca} --tls-cert {pki.cert('client')} --tls-key {pki.key('client')} "
            f"--control-token-file {pki.control_token_file}",
        ]
    )


@dataclass(frozen=True)
class FleetHealth:
    """What the capacity service says of the workers: how many are healthy, and for each one that is
    not, its URL and why."""

    healthy: int
    total: int
    problems: tuple[tuple[str, str], ...]
    pending: int = 0
    """Workers not polled successfully yet and not yet declared unhealthy."""
    degraded: str = ""
    """The loud warning naming each worker whose server arguments make Bandmaster know less ("" = none)."""

    @property
    def settled(self) -> bool:
        """Nothing more to wait for: every worker is healthy, or some are and the others have been found
        unhealthy (a fleet with none healthy is waited for until the timeout: its workers may be starting)."""
        return self.total > 0 and (self.healthy == self.total or (self.healthy > 0 and self.pending == 0))


def fleet_health(snapshot: capacity_pb2.WorkersSnapshot) -> FleetHealth:
    problems = []
    healthy = pending = 0
    for worker in snapshot.workers:
        if worker.health == capacity_pb2.WORKER_HEALTH_HEALTHY:
            healthy += 1
            continue
        if worker.health == capacity_pb2.WORKER_HEALTH_PENDING:
            pending += 1
        state = capacity_pb2.WorkerHealth.Name(worker.health).removeprefix("WORKER_HEALTH_").lower()
        why = worker.excluded_reason or (
            f"{worker.consecutive_failures} failed polls" if worker.consecutive_failures else "not answered yet"
        )
        problems.append((worker.url or worker.worker_id, why if why.startswith(state) else f"{state}: {why}"))
    return FleetHealth(healthy, len(snapshot.workers), tuple(problems), pending, degraded_banner(snapshot))


def no_healthy_worker_banner(health: FleetHealth, waited_s: float | None = None) -> str:
    """The loud console warning (and, with --require-healthy, the error) for a fleet without a healthy worker."""
    rule = "!" * 78
    after = f" after {waited_s:.0f} s" if waited_s is not None else ""
    lines = [
        rule,
        f"NO HEALTHY WORKER{after}: requests will fail with 503 until one is.",
        *(f"  {url}: {why}" for url, why in health.problems),
    ]
    if not health.problems:
        lines.append("  (the capacity service knows no worker)")
    lines.append(rule)
    return "\n".join(lines)


def _control_call(cluster: Cluster):
    """A channel to the capacity service and the call metadata (the control token of a secure cluster)."""
    address = cluster.capacity.endpoint if cluster.capacity else ""
    credentials = cluster.supervisor.grpc_credentials
    if credentials is None or cluster.pki is None:
        return grpc.insecure_channel(address), ()
    token = cluster.pki.control_token_file.read_text().split()[0]
    return grpc.secure_channel(address, credentials), (("authorization", f"Bearer {token}"),)


def read_fleet_health(cluster: Cluster, timeout_s: float = 5.0) -> FleetHealth | None:
    channel, metadata = _control_call(cluster)
    try:
        with channel:
            snapshot = capacity_pb2_grpc.CapacityStub(channel).ListWorkers(
                capacity_pb2.ListWorkersRequest(), timeout=timeout_s, metadata=metadata
            )
    except grpc.RpcError:
        return None
    return fleet_health(snapshot)


def wait_for_fleet(cluster: Cluster, timeout_s: float, should_stop) -> tuple[FleetHealth | None, float]:
    """Poll until every worker is healthy or `timeout_s` passed; returns the last view and the wait."""
    started = time.monotonic()
    health = None
    while True:
        health = read_fleet_health(cluster) or health
        waited = time.monotonic() - started
        if (health is not None and health.settled) or waited >= timeout_s or should_stop():
            return health, waited
        time.sleep(0.2)


def discovery_record(cluster: Cluster) -> dict:
    """The discovery record (registry entry and <state dir>/cluster.json): this process, the state dir, every
    address (a service the cluster does not run has none)."""
    record = {
        "pid": os.getpid(),
        "pid_start": endpoints.process_start(os.getpid()),
        "state_dir": str(cluster.supervisor.state_dir),
        "secure": cluster.pki is not None,
        "http_url": cluster.http_url,
        "workers": list(cluster.workers),
    }
    if cluster.supervisor.trace_dir is not None:
        record["trace_dir"] = str(cluster.supervisor.trace_dir)
    for child in cluster.supervisor.children:
        if child.spec.kind == "grpc":
            record[child.spec.name] = child.endpoint
    if cluster.batch is not None:
        record["batch_http"] = cluster.batch.ready.get("http", "")
    return record


def publish(cluster: Cluster, registry: Path, name: str, published: list[Path]) -> str:
    """Register the cluster (under `name`, else the first free default name) and write its record into its
    state dir; the paths written are appended to `published` (removed at stop). Returns the name, "" when
    `name` was taken by a cluster started meanwhile. A registry that cannot be written is said, not fatal:
    `--state-dir` still reaches the cluster."""
    record = discovery_record(cluster)
    try:
        taken = endpoints.register(registry, record, name)
        if not taken:
            return ""
        published.append(registry / f"{taken}.json")
    except OSError as exc:
        taken = name or endpoints.DEFAULT_NAME
        print(f"bandmaster up: cannot write the cluster registry {registry} ({exc.strerror})", file=sys.stderr)
    published.append(endpoints.write_state_record(cluster.supervisor.state_dir, {**record, "name": taken}))
    return taken


def cluster_line(name: str, registry: Path, published: list[Path], running: list[dict]) -> str:
    """How the client commands reach this cluster."""
    if len(published) < 2:
        return f"cluster {name}: not registered; reach it with --state-dir {published[0].parent}"
    others = ", ".join(r["name"] for r in running if r["name"] != name)
    return (
        f"cluster {name} (registered in {registry}{f'; also running: {others}' if others else ''}): "
        f"bandmaster status --cluster {name}   (programs, plan, batch and trace take --cluster too; without it "
        "they find the only cluster running)"
    )


def removable_state(args: argparse.Namespace, state_dir: Path, trace_dir: Path | None) -> bool:
    """`state_dir` goes at a clean stop when `up` made it (no --state-dir), --keep-state is not given, and no
    traces were written into it (`--trace-dir` without DIR)."""
    if args.state_dir is not None or args.keep_state:
        return False
    return trace_dir is None or not trace_dir.is_relative_to(state_dir.absolute())


SCHEDULER_RESTART_S = 2.0
"""Least time between two starts of the same scheduler replica."""


def _same_ports(child) -> ChildSpec:
    """`child`'s spec listening on the ports it had bound (with --ports auto its flags say 0)."""
    args = list(child.spec.args)
    bound = {"--listen": child.ready.get("grpc"), "--metrics-port": child.ready.get("metrics_port")}
    for flag, value in bound.items():
        if value and flag in args:
            args[args.index(flag) + 1] = str(value)
    return replace(child.spec, args=args)


def restart_scheduler_replicas(cluster: Cluster, config: ClusterConfig, restarts: dict[str, float]) -> list:
    """The children that stopped, less the scheduler replicas of an active/standby cluster, which are started
    again as standbys (another replica leads meanwhile) at most once per SCHEDULER_RESTART_S each."""
    dead = cluster.supervisor.failed()
    if config.scheduler_replicas < 2:
        return dead
    others = []
    now = time.monotonic()
    for child in dead:
        if not child.spec.name.startswith("scheduler"):
            others.append(child)
            continue
        if now - restarts.get(child.spec.name, -SCHEDULER_RESTART_S) < SCHEDULER_RESTART_S:
            continue
        restarts[child.spec.name] = now
        print(
            f"bandmaster up: {child.spec.name} stopped (exit {child.process.returncode}); another replica leads; "
            "starting it again as a standby",
            file=sys.stderr,
            flush=True,
        )
        cluster.supervisor.children.remove(child)
        replacement = cluster.supervisor.start(_same_ports(child))
        replacement.ready = dict(child.ready)  # same ports: its address stays the one the router was given
        cluster.schedulers = [replacement if c is child else c for c in cluster.schedulers]
        if cluster.scheduler is child:
            cluster.scheduler = replacement
    return others


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    args.http_port = http_port(args)
    config = cluster_config(
        args,
        scheduler_state=True,
        planner=not args.no_planner,
        planner_connector=args.planner_connector,
        planner_max_replicas=args.planner_max_replicas,
        planner_args=tuple(args.planner_args),
        ports=cluster_ports(args),
    )
    require_healthy = bool(config.worker_urls) if args.require_healthy is None else args.require_healthy
    registry = endpoints.clusters_dir()
    running = endpoints.running_clusters(registry)
    if args.name:
        endpoints.check_name(args.name)
        holder = next((r for r in running if r["name"] == args.name), None)
        if holder is not None:
            print(
                f"bandmaster up: a cluster named {args.name!r} is already running: {endpoints.describe(holder)}; "
                "stop it, or choose another --name",
                file=sys.stderr,
            )
            return 1
    taken = busy_ports(config)
    if taken:
        # The first taken port in full; the others (another cluster holds them all, typically) in one line.
        print(f"bandmaster up: {taken[0][1]}", file=sys.stderr)
        if len(taken) > 1:
            print(f"bandmaster up: also taken: {', '.join(str(port) for port, _ in taken[1:])}", file=sys.stderr)
        if running:
            print(
                "bandmaster up: running Bandmaster clusters: "
                + "; ".join(endpoints.describe(r) for r in running)
                + ". Stop one, or start this one with --ports auto (and --name)",
                file=sys.stderr,
            )
        return 1
    stop_requested = False

    def request_stop(_signum, _frame) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    try:
        cluster = start_cluster(config)
    except StartupError as exc:
        print(f"bandmaster up: {exc}", file=sys.stderr)
        return 1
    published: list[Path] = []
    clean = False
    try:
        health, waited = wait_for_fleet(cluster, args.healthy_timeout_seconds, lambda: stop_requested)
        if stop_requested:
            clean = True
            return 0
        if health is None or health.healthy == 0:
            banner = no_healthy_worker_banner(health or FleetHealth(0, 0, ()), waited)
            if require_healthy:
                print(banner, file=sys.stderr)
                print(
                    "bandmaster up: --require-healthy: stopping (start the workers first, or give "
                    "--no-require-healthy to run without them)",
                    file=sys.stderr,
                    flush=True,
                )
                return 1
            print(banner, file=sys.stderr, flush=True)
        elif health.problems:
            for url, why in health.problems:
                print(f"bandmaster up: WARNING: worker {url} is not healthy ({why})", file=sys.stderr, flush=True)
        last_degraded = health.degraded if health is not None else ""
        if last_degraded:
            print(last_degraded, file=sys.stderr, flush=True)
        name = publish(cluster, registry, args.name, published)
        if not name:
            print(f"bandmaster up: the cluster name {args.name!r} was taken meanwhile; stopping", file=sys.stderr)
            return 1
        print(render_table(["process", "endpoint"], cluster.endpoints(), title=f"Bandmaster is up (cluster {name}):"))
        if health is None or health.healthy == 0:
            print("Bandmaster is up WITHOUT A HEALTHY WORKER (see the warning above).")
        if cluster.batch is not None:
            print(
                f"Batch API: {cluster.http_url}/v1/batches (through the router; the batch service's own: "
                f"{cluster.batch.ready.get('http', '')}/v1)   plan: bandmaster plan --cluster {name}"
            )
        if cluster.pki is not None:
            print(connect_help(cluster))
        print(cluster_line(name, registry, published, endpoints.running_clusters(registry)))
        if cluster.supervisor.trace_dir is not None:
            print(f"traces: {cluster.supervisor.trace_dir}   (bandmaster trace --dir {cluster.supervisor.trace_dir})")
        removed = (
            " (removed at a clean stop; --keep-state keeps it)"
            if removable_state(args, cluster.supervisor.state_dir, cluster.supervisor.trace_dir)
            else ""
        )
        print(f"logs: {cluster.supervisor.state_dir}{removed}   (Ctrl-C to stop)", flush=True)
        last_healthy = health.healthy if health is not None else 0
        next_check = time.monotonic() + 2.0
        restarts: dict[str, float] = {}
        while not stop_requested:
            dead = restart_scheduler_replicas(cluster, config, restarts)
            if dead:
                names = ", ".join(f"{c.spec.name} (exit {c.process.returncode})" for c in dead)
                print(f"bandmaster up: {names} stopped unexpectedly; stopping the cluster", file=sys.stderr)
                return 1
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + 2.0
                now = read_fleet_health(cluster)
                if now is not None and (now.healthy == 0) != (last_healthy == 0):
                    if now.healthy == 0:
                        print(no_healthy_worker_banner(now), file=sys.stderr, flush=True)
                    else:
                        print(f"bandmaster up: {now.healthy} of {now.total} workers healthy again", flush=True)
                    last_healthy = now.healthy
                if now is not None and now.degraded != last_degraded:
                    # Once per change (a worker restarted with or without the flags), never once per check.
                    print(now.degraded or "bandmaster up: no worker is degraded any more", file=sys.stderr, flush=True)
                    last_degraded = now.degraded
            time.sleep(0.2)
        clean = True
        return 0
    finally:
        for path in published:
            endpoints.unregister(path, os.getpid())
        cluster.stop()
        state_dir = cluster.supervisor.state_dir
        if clean and removable_state(args, cluster.supervisor.state_dir, cluster.supervisor.trace_dir):
            shutil.rmtree(state_dir, ignore_errors=True)
            print("Bandmaster stopped.", flush=True)
        elif args.state_dir is None:
            print(f"Bandmaster stopped. Its state dir is kept: {state_dir}", flush=True)
        else:
            print("Bandmaster stopped.", flush=True)
