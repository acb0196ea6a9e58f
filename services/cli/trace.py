"""`bandmaster trace`: the tree of one turn, from the span files services write with `--trace-file`.

No collector needed: `bandmaster up --trace-dir DIR` gives every process a file under DIR, and this command
merges the files of all of them (one JSON object a line, services/common/observe/telemetry.py `span_record`) into
one indented tree with each span's offset from the turn's start and its duration.

Which turn: `--request-id ID` (the router's request id, `router.request_id` on `router.request`, or the
start of a trace id), `--session-id S --turn N` (the Nth `router.request` of session S by start time, 1 =
its first, -1 its last) or `--last` (the turn that started last; the default). The selection and the
tree are pure functions of the records (`select_trace`, `build_tree`, `render`), tested without files.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

TURN_SPANS = ("router.request", "client.turn")
"""The spans a turn's trace is found by (the router's, or the benchmark client's above it)."""


@dataclass
class SpanNode:
    record: dict
    children: list[SpanNode] = field(default_factory=list)

    @property
    def start_ns(self) -> int:
        return int(self.record.get("start_ns") or 0)

    @property
    def end_ns(self) -> int:
        return int(self.record.get("end_ns") or self.start_ns)


def read_spans(paths: Iterable[Path]) -> tuple[list[dict], int]:
    """Every span record of `paths`, and how many lines were not one (a file cut mid-line by a kill)."""
    spans: list[dict] = []
    bad = 0
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    bad += 1
                    continue
                if isinstance(record, dict) and record.get("trace_id") and record.get("span_id"):
                    spans.append(record)
                else:
                    bad += 1
    return spans, bad


def _turn_spans(spans: Sequence[dict]) -> list[dict]:
    return sorted((s for s in spans if s.get("name") == "router.request"), key=lambda s: s.get("start_ns") or 0)


def select_trace(
    spans: Sequence[dict],
    *,
    request_id: str | None = None,
    session_id: str | None = None,
    turn: int | None = None,
) -> str:
    """The trace id of the one turn asked for (none asked for: the last); LookupError saying what was not found."""
    requests = _turn_spans(spans)
    if request_id:
        by_id = [s for s in requests if (s.get("attributes") or {}).get("router.request_id") == request_id]
        if not by_id:
            by_id = [s for s in spans if str(s.get("trace_id", "")).startswith(request_id.lower())]
        if not by_id:
            raise LookupError(f"no turn has request id or trace id {request_id!r}")
        return str(by_id[-1]["trace_id"])
    if session_id:
        of_session = [s for s in requests if (s.get("attributes") or {}).get("router.session_id") == session_id]
        if not of_session:
            raise LookupError(f"no turn of session {session_id!r} (router.request spans carry router.session_id)")
        index = -1 if turn is None else turn
        if index == 0 or abs(index) > len(of_session):
            raise LookupError(f"session {session_id!r} has {len(of_session)} turns; --turn {index} is not one")
        return str(of_session[index - 1 if index > 0 else index]["trace_id"])
    roots = requests or sorted((s for s in spans if s.get("name") in TURN_SPANS), key=lambda s: s.get("start_ns") or 0)
    if not roots:
        raise LookupError("no turn in these files (no router.request span)")
    return str(roots[-1]["trace_id"])


def build_tree(spans: Sequence[dict], trace_id: str) -> list[SpanNode]:
    """The spans of `trace_id` as trees, children by start time. A span whose parent is in no file (a
    process that wrote none, a client outside) is a root of its own."""
    nodes = {s["span_id"]: SpanNode(s) for s in spans if s.get("trace_id") == trace_id}
    roots: list[SpanNode] = []
    for node in nodes.values():
        parent = nodes.get(node.record.get("parent_id") or "")
        if parent is not None and parent is not node:
            parent.children.append(node)
        else:
            roots.append(node)
    for node in nodes.values():
        node.children.sort(key=lambda n: n.start_ns)
    roots.sort(key=lambda n: n.start_ns)
    return roots


def _short(service: str) -> str:
    return service.removeprefix("bandmaster-")


def render(roots: Sequence[SpanNode], *, attributes: bool = False) -> list[str]:
    """One line per span: tree branch, name, service, start offset from the first span, duration; with
    `attributes`, the span's attributes and events under it."""
    if not roots:
        return []
    t0 = min(r.start_ns for r in roots)
    rows: list[tuple[str, SpanNode, str]] = []

    def walk(node: SpanNode, prefix: str, branch: str, child_prefix: str) -> None:
        rows.append((prefix + branch + str(node.record.get("name", "?")), node, prefix + child_prefix))
        for i, child in enumerate(node.children):
            final = i == len(node.children) - 1
            walk(child, prefix + child_prefix, "└─ " if final else "├─ ", "   " if final else "│  ")

    for root in roots:
        walk(root, "", "", "")
    width = max(len(label) for label, _, _ in rows)
    service_width = max(len(_short(str(n.record.get("service", "")))) for _, n, _ in rows)
    lines = []
    for label, node, detail_prefix in rows:
        offset_ms = (node.start_ns - t0) / 1e6
        duration_ms = (node.end_ns - node.start_ns) / 1e6
        status = "  ERROR" if node.record.get("status") == "ERROR" else ""
        service = _short(str(node.record.get("service", "")))
        lines.append(
            f"{label:<{width}}  {service:<{service_width}}  +{offset_ms:9.1f} ms  {duration_ms:9.1f} ms{status}"
        )
        if attributes:
            pad = detail_prefix + ("│  " if node.children else "   ")
            for key, value in sorted((node.record.get("attributes") or {}).items()):
                lines.append(f"{pad}{key}={value}")
            for event in node.record.get("events") or ():
                at_ms = (int(event.get("t_ns") or 0) - t0) / 1e6
                lines.append(f"{pad}@ +{at_ms:.1f} ms {event.get('name')}")
    return lines


def trace_files(files: Sequence[str], directories: Sequence[str]) -> list[Path]:
    paths = [Path(f) for f in files]
    for directory in directories:
        paths.extend(sorted(Path(directory).glob("*.jsonl")))
    return paths


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "trace",
        help="print the span tree of one turn from --trace-file span files (no collector needed)",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    parser.add_argument("--file", action="append", default=[], help="a span file (repeat for each service)")
    parser.add_argument(
        "--dir",
        action="append",
        default=[],
        help="every *.jsonl file in this directory (e.g. `bandmaster up --trace-dir DIR`); default: the running "
        "cluster's trace dir",
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--request-id", help="the turn with this router request id (or trace id prefix)")
    which.add_argument("--session-id", help="a turn of this session (with --turn; default its last)")
    which.add_argument("--last", action="store_true", help="the turn that started last (the default)")
    parser.add_argument("--turn", type=int, help="with --session-id: 1 = the session's first turn, -1 its last")
    parser.add_argument("--attributes", action="store_true", help="also print each span's attributes and events")
    parser.add_argument(
        "--cluster",
        default="",
        metavar="NAME",
        help="without --file/--dir: the trace dir of this running cluster (default: the only one running)",
    )
    parser.set_defaults(run=run)


def _cluster_trace_dir(name: str) -> str | None:
    from services.cli import endpoints

    record = endpoints.choose(endpoints.running_clusters(endpoints.clusters_dir()), name)
    return (record or {}).get("trace_dir") or None


def run(args: argparse.Namespace) -> int:
    if args.turn is not None and not args.session_id:
        print("bandmaster trace: --turn goes with --session-id", file=sys.stderr)
        return 2
    directories = list(args.dir)
    if not args.file and not directories:
        found = _cluster_trace_dir(args.cluster)
        if found is None:
            print(
                "bandmaster trace: give --file or --dir (no running cluster was started with --trace-dir)",
                file=sys.stderr,
            )
            return 2
        directories.append(found)
    paths = trace_files(args.file, directories)
    try:
        spans, bad = read_spans(paths)
    except OSError as exc:
        print(f"bandmaster trace: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 1
    if bad:
        print(f"bandmaster trace: skipped {bad} lines that are not span records", file=sys.stderr)
    try:
        trace_id = select_trace(spans, request_id=args.request_id, session_id=args.session_id, turn=args.turn)
    except LookupError as exc:
        print(f"bandmaster trace: {exc.args[0]} ({len(spans)} spans in {len(paths)} files)", file=sys.stderr)
        return 1
    roots = build_tree(spans, trace_id)
    request = next((n.record for n in roots if n.record.get("name") in TURN_SPANS), roots[0].record)
    names = request.get("attributes") or {}
    heading = [f"trace {trace_id}"]
    for key in ("router.request_id", "router.session_id"):
        if key in names:
            heading.append(f"{key.removeprefix('router.')}={names[key]}")
    print("  ".join(heading))
    for line in render(roots, attributes=args.attributes):
        print(line)
    return 0
