"""`bandmaster up`: the embedded local cluster, in the foreground until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from services.cli.cluster import Cluster, ClusterConfig, start_cluster
from services.cli.supervisor import StartupError
from services.cli.table import render_table
from services.common.logs import setup_logging


def add_cluster_arguments(parser: argparse.ArgumentParser, *, workers_default: int = 2) -> None:
    parser.add_argument("--workers", type=int, default=workers_default, help="simulated SGLang workers to start")
    parser.add_argument("--worker-url", action="append", default=[], dest="worker_urls",
                        help="a real SGLang server URL (repeatable); no simulated workers are started then")
    parser.add_argument("--worker-kv-tokens", type=int, default=65_536, help="GPU KV pool of each simulated worker")
    parser.add_argument("--worker-host-kv-tokens", type=int, default=0,
                        help="HiCache host tier of each simulated worker, in tokens (0 = off)")
    parser.add_argument("--worker-page-size", type=int, default=16)
    parser.add_argument("--speedup", type=float, default=1.0, dest="worker_speedup",
                        help="simulated workers run this many times faster than the real hardware")
    parser.add_argument("--timing-profile", default="glm45-fp8-h200", dest="worker_timing_profile")
    parser.add_argument("--model-name", default="bandmaster-sim")
    parser.add_argument("--tokenizer", default="",
                        help="the model's tokenizer directory (tokenizer.json + tokenizer_config.json) for the router "
                             "and the simulated workers: exact token routing with KV events (default: text routing)")
    parser.add_argument("--http-port", type=int, default=8000, help="the router's OpenAI/SGLang HTTP port (0 = any)")
    parser.add_argument("--no-scheduler", action="store_true",
                        help="start no program scheduler: the router does KV-aware routing only")
    parser.add_argument("--scheduler-arg", action="append", default=[], dest="scheduler_args",
                        help="extra flag for the scheduler, e.g. --scheduler-arg=--pause-threshold=0.9 (repeatable)")
    parser.add_argument("--router-arg", action="append", default=[], dest="router_args",
                        help="extra flag for the router, e.g. --router-arg=--seed=0 (repeatable)")
    parser.add_argument("--state-dir", type=Path, default=None,
                        help="where child logs and ready files go; `bandmaster up` also keeps the scheduler's program "
                             "table there (scheduler-state.sqlite), recovered when it is started again with it")
    parser.add_argument("--log-level", default="INFO")


def cluster_config(args: argparse.Namespace, **overrides) -> ClusterConfig:
    values = dict(
        workers=args.workers, worker_urls=tuple(args.worker_urls), worker_kv_tokens=args.worker_kv_tokens,
        worker_host_kv_tokens=args.worker_host_kv_tokens, worker_page_size=args.worker_page_size,
        worker_speedup=args.worker_speedup, worker_timing_profile=args.worker_timing_profile,
        model_name=args.model_name, state_dir=args.state_dir, log_level=args.log_level.upper(),
        http_port=args.http_port, scheduler=not args.no_scheduler, scheduler_args=tuple(args.scheduler_args),
        router_args=tuple(args.router_args),
        tokenizer=os.path.abspath(args.tokenizer) if args.tokenizer else "",  # the children run elsewhere
        secure=getattr(args, "secure", False),
    )
    values.update(overrides)
    return ClusterConfig(**values)


def add_parser(commands) -> None:
    parser = commands.add_parser("up", help="start the local cluster in the foreground (Ctrl-C stops it)")
    add_cluster_arguments(parser)
    parser.add_argument("--secure", action="store_true",
                        help="mutual TLS on every gRPC port, HTTPS and a bearer token on the router's HTTP API, a "
                             "control token on control RPCs: a local CA, certificates and tokens are made in "
                             "<state dir>/secure/ (reused when it already holds them); see docs/security.md")
    parser.add_argument("--no-planner", action="store_true",
                        help="start no planner: no Batch API (/v1/files, /v1/batches answer 501), no drain leases")
    parser.add_argument("--planner-connector", choices=("virtual", "local"), default="virtual",
                        help="virtual (default): the planner sees the --workers simulated workers as a fixed fleet; "
                             "local: the planner starts and stops the simulated workers itself (--workers as its idle "
                             "target, more for batch work, up to --planner-max-replicas)")
    parser.add_argument("--planner-max-replicas", type=int, default=0,
                        help="most workers the local connector runs (default: --workers + 2)")
    parser.add_argument("--planner-arg", action="append", default=[], dest="planner_args",
                        help="extra flag for the planner, e.g. --planner-arg=--safe-rps-per-replica=20 (repeatable)")
    parser.set_defaults(run=run)


def connect_help(cluster: Cluster) -> str:
    """How a client reaches a secure cluster (paths only: a token is never printed)."""
    pki = cluster.pki
    assert pki is not None
    return "\n".join([
        f"secure: mutual TLS on gRPC, HTTPS on {cluster.http_url} (CA {pki.ca})",
        f"  data token (HTTP API, Router.Generate/Release): {pki.data_token_file}",
        f"  control token (control RPCs):                   {pki.control_token_file}",
        f"  gRPC client certificate: {pki.cert('client')}  key: {pki.key('client')}",
        f"  curl --cacert {pki.ca} -H \"Authorization: Bearer $(cat {pki.data_token_file})\" {cluster.http_url}/v1/models",
        f"  OpenAI(base_url=\"{cluster.http_url}/v1\", api_key=open(\"{pki.data_token_file}\").read().strip(), "
        f"http_client=openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=\"{pki.ca}\")))",
        f"  bandmaster programs --scheduler-addr {cluster.scheduler.endpoint if cluster.scheduler else 'HOST:PORT'} "
        f"--tls-ca {pki.ca} --tls-cert {pki.cert('client')} --tls-key {pki.key('client')} "
        f"--control-token-file {pki.control_token_file}",
    ])


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    config = cluster_config(args, scheduler_state=True, planner=not args.no_planner,
                            planner_connector=args.planner_connector, planner_max_replicas=args.planner_max_replicas,
                            planner_args=tuple(args.planner_args))
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
    try:
        print(render_table(["process", "endpoint"], cluster.endpoints(), title="Bandmaster is up:"))
        if cluster.planner is not None:
            print(f"Batch API: {cluster.http_url}/v1/batches (through the router; the planner's own: "
                  f"{cluster.planner.ready.get('http', '')}/v1)   plan: bandmaster plan --state-dir "
                  f"{cluster.supervisor.state_dir}")
        if cluster.pki is not None:
            print(connect_help(cluster))
        print(f"logs: {cluster.supervisor.state_dir}   (Ctrl-C to stop)", flush=True)
        while not stop_requested:
            dead = cluster.supervisor.failed()
            if dead:
                names = ", ".join(f"{c.spec.name} (exit {c.process.returncode})" for c in dead)
                print(f"bandmaster up: {names} stopped unexpectedly; stopping the cluster", file=sys.stderr)
                return 1
            time.sleep(0.2)
        return 0
    finally:
        cluster.stop()
        print("Bandmaster stopped.", flush=True)
