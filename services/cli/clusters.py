"""`bandmaster clusters`: the clusters of this user that run now (the registry of services/cli/endpoints.py),
each with the name that `status`, `programs`, `plan`, `batch` and `trace` take as `--cluster`."""

from __future__ import annotations

import argparse
import json
import os
from typing import Mapping

from services.cli import endpoints
from services.launcher.table import render_table

SERVICES = ("capacity", "scheduler", "router", "planner", "batch")


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "clusters", help="list the running clusters (their names for --cluster, addresses and state dirs)"
    )
    parser.add_argument("--json", action="store_true", help="print each cluster's discovery record as JSON")
    parser.set_defaults(run=run)


def services(record: Mapping) -> str:
    """The services a cluster runs (`scheduler x2` for active/standby replicas)."""
    replicas = sum(1 for key in record if key == "scheduler" or key.startswith("scheduler-"))
    names = [name for name in SERVICES if record.get(name)]
    return " ".join(f"scheduler x{replicas}" if name == "scheduler" and replicas > 1 else name for name in names)


def render(running: list[dict], registry: str) -> str:
    if not running:
        return f"no cluster is running (registry {registry}); start one with `bandmaster up`"
    rows = [
        [
            r["name"],
            str(r.get("pid", "?")),
            r.get("http_url", "") or "-",
            services(r),
            "yes" if r.get("secure") else "",
            r.get("state_dir", ""),
        ]
        for r in running
    ]
    return render_table(
        ["name", "pid", "router HTTP", "services", "secure", "state dir"],
        rows,
        title=f"clusters ({len(running)} running, registry {registry})",
    )


def run(args: argparse.Namespace, env: Mapping[str, str] = os.environ) -> int:
    registry = endpoints.clusters_dir(env)
    running = endpoints.running_clusters(registry)
    if args.json:
        print(json.dumps(running, indent=1))
    else:
        print(render(running, str(registry)))
    return 0
