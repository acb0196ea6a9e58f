"""`bandmaster plan`: the planner's last tick (GetPlan) with provenance and diagnostics, and
`bandmaster batch submit [--wait]|list|get|cancel`: the batch service's Batch API (official openai client).

Both find the local cluster as services/cli/endpoints.py says (flags, `--cluster` or `--state-dir`, the one
running `bandmaster up` of the cluster registry, the default ports); a `--secure` cluster's `secure/`
directory gives the CA, the client certificate and the tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import time
from pathlib import Path
from typing import Callable, TextIO

import grpc

from bandmaster.planner.v1 import planner_pb2 as pb
from bandmaster.planner.v1 import planner_pb2_grpc as pb_grpc
from services.cli import SIGINT_EXIT, endpoints
from services.common.auth.security import DATA_TOKEN_ENV
from services.common.settings.config import parse_host_port
from services.launcher.table import render_table

_PROVENANCE = {
    pb.PROVENANCE_PROPOSE: "PROPOSE",
    pb.PROVENANCE_RECONCILE: "RECONCILE",
    pb.PROVENANCE_CONSTRAIN: "CONSTRAIN",
    pb.PROVENANCE_FAIL_CLOSED: "FAIL_CLOSED",
}
_WINDOW_UNITS = "smhd"
_ENDED = ("completed", "failed", "expired", "cancelled")


# -- bandmaster plan --------------------------------------------------------------------------------


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "plan",
        help="print the planner's last decision: lease, replica opinions with "
        "their provenance, fail-closed reasons, diagnostics",
    )
    parser.add_argument(
        "--planner-addr",
        default="",
        help="planner gRPC address host:port (default: from --cluster, --state-dir or the one running `bandmaster up`, "
        "else 127.0.0.1:50061)",
    )
    parser.add_argument("--timeout-seconds", type=float, default=5.0, help="deadline of the GetPlan call")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    endpoints.add_connection_arguments(parser)
    parser.set_defaults(run=run_plan)

    batch = commands.add_parser("batch", help="the Batch API (OpenAI's, served by the batch service)")
    batch.add_argument(
        "--base-url",
        default="",
        help="the Batch API base URL: the batch service's, or a router's (which forwards there) (default: the "
        "batch service of --cluster, --state-dir or the one running `bandmaster up`, else http://127.0.0.1:8090/v1)",
    )
    endpoints.add_connection_arguments(batch)
    actions = batch.add_subparsers(dest="action", required=True)
    submit = actions.add_parser("submit", help="upload a JSONL file and create a batch")
    submit.add_argument("file", type=Path, help="JSONL, one {custom_id, method, url, body} per line")
    submit.add_argument("--window", default="24h", help="completion window: <integer><s|m|h|d> in [1m, 7d]")
    submit.add_argument("--endpoint", default="", help="default: the url of the file's first line")
    submit.add_argument(
        "--wait",
        action="store_true",
        help="after printing the batch id, poll until the batch ends with a progress bar (sparse lines off a "
        "terminal), then print its final counts and output file id; exit 1 unless it completed. Ctrl-C stops "
        "waiting and does NOT cancel the batch (`bandmaster batch cancel ID` does)",
    )
    submit.add_argument("--poll-seconds", type=float, default=2.0, help="with --wait: seconds between polls")
    listing = actions.add_parser("list", help="the newest batches")
    listing.add_argument("--limit", type=int, default=20)
    for name, text in (("get", "one batch (with --output: its output and error lines)"), ("cancel", "cancel a batch")):
        sub = actions.add_parser(name, help=text)
        sub.add_argument("batch_id")
        if name == "get":
            sub.add_argument("--output", action="store_true", help="also print the output and error files")
    batch.set_defaults(run=run_batch)


def run_plan(args: argparse.Namespace) -> int:
    endpoints.discover(args, args.planner_addr)
    endpoints.fill_security(args)
    address = endpoints.grpc_address(args, args.planner_addr, "planner")
    parse_host_port(address, "planner_addr")  # ConfigError -> exit 2 in services.cli.main
    try:
        channel, metadata = endpoints.channel(address, args)
        with channel:
            plan = pb_grpc.PlannerStub(channel).GetPlan(
                pb.GetPlanRequest(), timeout=args.timeout_seconds, metadata=metadata
            )
    except grpc.RpcError as exc:
        print(f"bandmaster plan: {address}: {endpoints.rpc_error(exc, address, args)}", file=sys.stderr)
        return 1
    if args.json:
        from google.protobuf.json_format import MessageToDict

        print(json.dumps(MessageToDict(plan, preserving_proto_field_name=True), indent=1))
    else:
        print(render(plan))
    return 0


def _num(value: float, fmt: str = "{:.2f}") -> str:
    return "inf" if value == float("inf") else fmt.format(value)


def render(plan: pb.Plan) -> str:
    """The decision first (what was published and actuated, and why not more), then the opinions that
    made it, then what the planner saw."""
    lease = plan.leases[0] if plan.leases else None
    head = [
        [
            "decision",
            f"{plan.decision_id} ({plan.tick_seconds * 1000:.0f} ms tick)" + (" ADVISORY" if plan.advisory else ""),
        ],
        ["action", plan.action or "-"],
        [
            "lease",
            f"{lease.max_admission_rps:g} rps (epoch {lease.writer_epoch}, seq {lease.writer_sequence})"
            if lease
            else "none",
        ],
        [
            "replicas",
            ", ".join(
                part
                for part in (
                    f"floor {plan.replica_floor}" if plan.has_replica_floor else "",
                    f"idle target {plan.idle_target}" if plan.has_idle_target else "",
                    f"scaled to {plan.scale_to}" if plan.has_scale_to else "no scaling",
                )
                if part
            ),
        ],
        ["effects", plan.effects_outcome + (f": {plan.effects_error}" if plan.effects_error else "")],
        ["fail-closed", ", ".join(plan.fail_closed_reasons) or "-"],
        ["policy", "; ".join(plan.policy_reasons) or "-"],
        [
            "batch",
            f"required {_num(plan.required_batch_rps)} rps, planned {_num(plan.planned_batch_capacity_rps)} rps, "
            f"min deadline slack {_num(plan.minimum_deadline_slack_s, '{:.0f}')} s",
        ],
    ]
    targets = render_table(
        ["source", "provenance", "kind", "replicas", "effect", "reason"],
        [
            [
                t.source + (" (replayed)" if t.replayed else ""),
                _PROVENANCE.get(t.provenance, "?"),
                t.kind,
                t.replicas,
                t.effect,
                t.reason,
            ]
            for t in plan.targets
        ],
        title=f"replica opinions ({len(plan.targets)})",
    )
    o = plan.observation

    def known(flag: bool, text: str) -> str:
        return text if flag else "unknown"

    seen = [
        ["jobs", known(o.jobs_known, f"{o.active_jobs} active, {o.remaining_requests} requests left")],
        ["online traffic", known(o.traffic_known, f"{o.online_offered_rps:.2f} rps")],
        [
            "fleet",
            known(
                o.inventory_known,
                f"{o.ready_replicas} ready, {o.pending_replicas} pending, desired "
                f"{o.desired_replicas if o.desired_replicas >= 0 else 'unknown'}"
                + (" (scaling)" if o.scaling_in_progress else ""),
            ),
        ],
        [
            "dispatcher",
            known(
                o.feedback_known,
                f"{o.queued_requests} queued, {o.inflight_requests} in flight, {o.actual_dispatch_rps:.2f} rps",
            ),
        ],
        ["programs", known(o.programs_known, f"{o.paused_programs} paused, utilisation {o.utilization:.1%}")],
        *[[f"proposer {name}", why] for name, why in sorted(plan.proposer_reasons.items())],
        *[["source error", err] for err in o.source_errors],
    ]
    return "\n\n".join(
        [render_table(["", ""], head, title="plan"), targets, render_table(["", ""], seen, title="observation")]
    )


# -- bandmaster batch -------------------------------------------------------------------------------


def _client(args: argparse.Namespace):
    import openai

    found = endpoints.discover(args, args.base_url)
    endpoints.fill_security(args)
    base_url = args.base_url
    if not base_url and found is None:
        base_url = f"http://{endpoints.default_address('batch_http')}/v1"
    elif not base_url and found is not None:
        # The batch service's own address (its record and ready file name it, scheme included).
        http = found.batch_http()
        if not http:
            raise found.absent("batch")
        base_url = f"{http}/v1"
    token = os.environ.get(DATA_TOKEN_ENV, "")
    if args.data_token_file:
        lines = Path(args.data_token_file).read_text().split()
        token = lines[0] if lines else ""
    http_client = None
    if args.tls_ca:
        http_client = openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=args.tls_ca))
    return openai.OpenAI(base_url=base_url, api_key=token or "unused", http_client=http_client, max_retries=2)


def _check_window(window: str) -> None:
    from services.common.settings.errors import ConfigError

    if len(window) < 2 or window[-1] not in _WINDOW_UNITS or not window[:-1].isdigit():
        raise ConfigError("window", window, "window is <integer><s|m|h|d>, e.g. 24h")


def _batch_row(b) -> list:
    counts = b.request_counts
    done = (
        f"{counts.completed}/{counts.total}" + (f" ({counts.failed} failed)" if counts.failed else "")
        if counts
        else "-"
    )
    return [b.id, b.status, done, b.output_file_id or "-", b.error_file_id or "-"]


def run_batch(args: argparse.Namespace) -> int:
    import openai

    if args.action == "submit":
        _check_window(args.window)
        if not args.poll_seconds > 0:
            from services.common.settings.errors import ConfigError

            raise ConfigError("poll_seconds", args.poll_seconds, "--poll-seconds > 0")
    client = _client(args)
    try:
        if args.action == "submit":
            endpoint = args.endpoint
            if not endpoint:
                with args.file.open("rb") as fh:
                    first = fh.readline()
                endpoint = (
                    json.loads(first).get("url", "/v1/chat/completions") if first.strip() else "/v1/chat/completions"
                )
            with args.file.open("rb") as fh:
                uploaded = client.files.create(file=(args.file.name, fh), purpose="batch")
            batch = client.batches.create(input_file_id=uploaded.id, endpoint=endpoint, completion_window=args.window)
            print(batch.id, flush=True)
            return wait_for_batch(client, batch, poll_s=args.poll_seconds) if args.wait else 0
        if args.action == "list":
            rows = [_batch_row(b) for b in client.batches.list(limit=args.limit).data]
            print(render_table(["batch", "status", "done", "output", "errors"], rows, title=f"batches ({len(rows)})"))
            return 0
        if args.action == "cancel":
            batch = client.batches.cancel(args.batch_id)
            print(f"{batch.id}: {batch.status}")
            return 0
        batch = client.batches.retrieve(args.batch_id)
        print(json.dumps(batch.model_dump(exclude_none=True), indent=1))
        if args.output:
            for file_id in (batch.output_file_id, batch.error_file_id):
                if file_id:
                    sys.stdout.write(client.files.content(file_id).text)
        return 0
    except json.JSONDecodeError as exc:
        print(f"bandmaster batch: {args.file}: the first line is not JSON: {exc}", file=sys.stderr)
        return 2
    except openai.APIStatusError as exc:
        print(f"bandmaster batch: {exc.status_code}: {exc.message}", file=sys.stderr)
        return 1
    except openai.APIConnectionError as exc:
        print(f"bandmaster batch: {client.base_url}: {exc.message}", file=sys.stderr)
        return 1


def _finished(batch) -> int:
    counts = batch.request_counts
    return counts.completed + counts.failed if counts else 0


def wait_for_batch(
    client,
    batch,
    *,
    poll_s: float,
    stream: TextIO | None = None,
    out: TextIO | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """`bandmaster batch submit --wait`: poll `batch` until it ends, drawing a progress bar of its finished
    requests on `stream` (stderr; off a terminal the bar writes a line only at each 10% and once a minute),
    then print one summary line on `out` (stdout): status, counts, output and error file ids. Returns 0 for
    a completed batch (failed requests are in its error file), 1 for failed, expired or cancelled.
    Ctrl-C stops waiting and leaves the batch running (SIGINT_EXIT)."""
    from clients.progress import ProgressBar

    stream = stream or sys.stderr
    out = out or sys.stdout
    total = batch.request_counts.total if batch.request_counts else 0
    bar = ProgressBar(total, label=batch.id, stream=stream)
    try:
        while batch.status not in _ENDED:
            sleep(poll_s)
            batch = client.batches.retrieve(batch.id)
            bar.advance(max(0, _finished(batch) - bar.done), extra=batch.status)
    except KeyboardInterrupt:
        bar.close()
        print(
            f"bandmaster batch: stopped waiting; batch {batch.id} is still {batch.status} and keeps running "
            f"(to cancel it: bandmaster batch cancel {batch.id})",
            file=stream,
        )
        return SIGINT_EXIT
    bar.close()
    counts = batch.request_counts
    done = f"{counts.completed}/{counts.total} completed, {counts.failed} failed" if counts else "no counts"
    print(
        f"{batch.id} {batch.status}: {done}; output file {batch.output_file_id or '-'}, "
        f"error file {batch.error_file_id or '-'}",
        file=out,
    )
    return 0 if batch.status == "completed" else 1
