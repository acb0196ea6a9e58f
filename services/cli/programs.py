"""`bandmaster programs`: the scheduler's program table and replica bands (the cluster is found as
services/cli/endpoints.py says: `--scheduler-addr`, `--cluster` or `--state-dir`, the one running
`bandmaster up`, port 50052)."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

import grpc

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from bandmaster.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from services.cli import endpoints
from services.common.outbound.leader_follow import leader_hint
from services.common.settings.config import parse_host_port
from services.launcher.table import render_table

_STATUS = {pb.PROGRAM_STATUS_REASONING: "reasoning", pb.PROGRAM_STATUS_ACTING: "acting"}
_LIFECYCLE = {pb.LIFECYCLE_ACTIVE: "active", pb.LIFECYCLE_PAUSED: "paused"}
_BAND = {pb.BAND_NORMAL: "normal", pb.BAND_SOFT_DEMOTE: "soft_demote", pb.BAND_PAUSE: "pause"}


def add_parser(commands) -> None:
    parser = commands.add_parser("programs", help="print the scheduler's program table and per-replica bands")
    parser.add_argument(
        "--scheduler-addr",
        default="",
        help="scheduler gRPC address host:port (default: from --cluster, --state-dir or the one running "
        "`bandmaster up`, else 127.0.0.1:50052)",
    )
    parser.add_argument("--timeout-seconds", type=float, default=5.0, help="deadline of the ListPrograms call")
    endpoints.add_connection_arguments(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    endpoints.discover(args, args.scheduler_addr)
    endpoints.fill_security(args)
    address = endpoints.grpc_address(args, args.scheduler_addr, "scheduler")
    parse_host_port(address, "scheduler_addr")  # ConfigError -> exit 2 in services.cli.main
    for _ in range(2):  # a standby names the leader (active/standby schedulers): ask it once
        try:
            channel, metadata = endpoints.channel(address, args)
            with channel:
                listing = pb_grpc.SchedulerStub(channel).ListPrograms(
                    pb.ListProgramsRequest(), timeout=args.timeout_seconds, metadata=metadata
                )
            break
        except grpc.RpcError as exc:
            leader = leader_hint(exc)
            if leader and leader != address:
                address = leader
                continue
            print(f"bandmaster programs: {address}: {endpoints.rpc_error(exc, address, args)}", file=sys.stderr)
            return 1
    print(render(listing))
    return 0


def render(listing: pb.ListProgramsResponse) -> str:
    programs = render_table(
        ["program", "lifecycle", "status", "tokens", "estimated", "worker", "dp", "marked", "demoted", "turns"],
        [
            [
                label,
                _LIFECYCLE.get(p.lifecycle, "?"),
                _STATUS.get(p.status, "?"),
                p.token_total,
                "yes" if p.tokens_estimated else "",
                p.worker_id or "-",
                p.dp_rank if p.worker_id else "-",
                "yes" if p.marked else "",
                "yes" if p.soft_demoted else "",
                p.turns,
            ]
            for label, p in _tree(listing.programs)
        ],
        title=f"programs ({len(listing.programs)})",
    )
    replicas = render_table(
        [
            "worker",
            "dp",
            "retention",
            "used",
            "used_decayed",
            "util",
            "band",
            "in_flight",
            "resident",
            "passthrough",
            "max",
        ],
        [
            [
                r.worker_id,
                r.dp_rank,
                r.retention_tokens,
                r.used_tokens,
                r.used_decayed_tokens,
                f"{r.utilization:.1%}",
                _BAND.get(r.band, "?"),
                r.active_programs,
                r.resident_programs,
                r.passthrough_requests,
                r.max_programs or "-",
            ]
            for r in sorted(listing.replicas, key=lambda r: (r.worker_id, r.dp_rank))
        ],
        title=f"replicas ({len(listing.replicas)})",
    )
    return f"{programs}\n\n{replicas}"


def _tree(programs: Sequence[pb.Program]) -> list[tuple[str, pb.Program]]:
    """Depth-first by parent, children indented; orphans (parent unknown) are roots."""
    by_id = {p.session_id: p for p in programs}
    roots = sorted((p for p in programs if p.parent_session_id not in by_id), key=lambda p: p.session_id)
    out: list[tuple[str, pb.Program]] = []
    seen: set[str] = set()

    def visit(program: pb.Program, depth: int) -> None:
        if program.session_id in seen:
            return
        seen.add(program.session_id)
        out.append((("  " * (depth - 1) + "└ " if depth else "") + program.session_id, program))
        for child in sorted(program.children):
            if child in by_id:
                visit(by_id[child], depth + 1)

    for root in roots:
        visit(root, 0)
    for program in sorted(programs, key=lambda p: p.session_id):  # cycles cannot happen, but never drop a row
        visit(program, 0)
    return out
