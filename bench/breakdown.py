"""`python -m bench.breakdown SPANS.jsonl [...] --out report.json`: where a turn's wall time goes.

Live: every process of a stack started with `BANDMASTER_TRACE_FILE=DIR/{service}-{pid}.jsonl` writes its
spans there (services/common/observe/telemetry.py); the benchmark's own process does too after `client_tracing()`
(the player's `client.turn` span). This joins them per turn (trace id) into the phases below and reports
each phase's mean, p50 and p90 in wall seconds and in simulated seconds (wall x the workers' speedup,
the seconds of the modelled hardware), plus the remainder no phase accounts for. Simulated:
`breakdown_from_sim` reads the same phases from the simulator's own event times (SimResult.turn_phases).

    phase                 live: from -> to                                         simulator
    client_send           client.turn start -> router.request start                live path model
    router_parse          router.request start -> router.admit start (or pick)     live path model
    admission_round_trip  router.admit, less the time held                         live path model
    admission_held        router.held_seconds                                      held by the scheduler core
    route                 router.admit end -> router.upstream start (pick, bind)   0
    router_to_worker      router.upstream start -> the worker's SERVER span        live path model
    worker_parse          worker span start -> queue.start, less worker_frontend   live path model
    worker_frontend       the simworker's modelled frontend (simworker.frontend_s) the profile's frontend_s
    queue                 queue.start -> queue.end (engine admission)              engine
    prefill               queue.end -> prefill.end (first token)                   engine
    decode                decode.start -> decode.end                               engine
    worker_lag            how much further the simworker's loop fell behind its    (none)
                          engine clock while serving the turn (simworker.lag_*_s)
    relay                 decode.end -> router.request end                         live path model
    client_receive        router.request end -> client.turn end                    (in relay)

and, outside the turn (not in its total): `client_between_turns`, the client's own wall time between
the previous answer (or the program's start) and this turn's send, less the tool wait it meant to
sleep (client.gap_s - client.tool_wait_s on `client.turn`): building the next message, the sleep's
overshoot, the client's event loop being busy with other programs. The simulator has none.

A turn is a trace with a `router.request` whose `router.upstream` reached a worker span. Without a
`client.turn` span (a client that sends no traceparent) the two client phases are absent and the total
is `router.request`'s length. With a failover, the last attempt's upstream and worker span count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from clients.stats import interpolated_percentile

if TYPE_CHECKING:
    from harness.simlib import SimResult

PHASES = (
    "client_send",
    "router_parse",
    "admission_round_trip",
    "admission_held",
    "route",
    "router_to_worker",
    "worker_parse",
    "worker_frontend",
    "queue",
    "prefill",
    "decode",
    "worker_lag",
    "relay",
    "client_receive",
)
# Reported beside the phases but not part of a turn's total.
BETWEEN_TURNS = "client_between_turns"
WORKER_SPAN_NAMES = ("POST /v1/chat/completions", "POST /v1/completions", "POST /generate")
NS = 1e-9


def read_spans(paths: Iterable[str | Path]) -> list[dict]:
    """Span records (services/common/observe/telemetry.py `span_record`) from JSON-lines files, or every
    `*.jsonl` file of a directory."""
    spans: list[dict] = []
    for path in paths:
        path = Path(path)
        files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
        for file in files:
            with file.open() as lines:
                spans.extend(json.loads(line) for line in lines if line.strip())
    return spans


def _event_ns(span: dict) -> dict[str, int]:
    return {e["name"]: e["t_ns"] for e in span.get("events", ())}


def turn_phases(trace: Sequence[dict]) -> dict | None:
    """The phases of one turn's spans in wall seconds (None = the phase did not happen or was not
    seen), plus `total`; None if the trace is not a turn that reached a worker."""
    by_name: dict[str, list[dict]] = defaultdict(list)
    for span in trace:
        by_name[span["name"]].append(span)
    requests = by_name.get("router.request")
    upstreams = sorted(by_name.get("router.upstream", ()), key=lambda s: s["start_ns"])
    if not requests or not upstreams:
        return None
    request, upstream = requests[0], upstreams[-1]
    workers = [
        s for name in WORKER_SPAN_NAMES for s in by_name.get(name, ()) if s.get("parent_id") == upstream["span_id"]
    ]
    if not workers:
        return None
    worker = workers[0]
    events = _event_ns(worker)
    if "queue.start" not in events or "decode.end" not in events:
        return None  # aborted before its first token: no engine phases to attribute
    attrs = worker.get("attributes", {})
    speedup = float(attrs.get("simworker.speedup") or 1.0)
    frontend_wall = float(attrs.get("simworker.frontend_s") or 0.0) / speedup
    admit = (by_name.get("router.admit") or [None])[0]
    picks = sorted(by_name.get("router.pick", ()), key=lambda s: s["start_ns"])
    after_parse_ns = admit["start_ns"] if admit is not None else (picks[0]["start_ns"] if picks else None)
    phases: dict[str, float | None] = dict.fromkeys(PHASES)
    if after_parse_ns is not None:
        phases["router_parse"] = (after_parse_ns - request["start_ns"]) * NS
    if admit is not None:
        held = float(admit.get("attributes", {}).get("router.held_seconds") or 0.0)
        phases["admission_held"] = held
        phases["admission_round_trip"] = (admit["end_ns"] - admit["start_ns"]) * NS - held
        phases["route"] = (upstream["start_ns"] - admit["end_ns"]) * NS
    elif picks:
        phases["route"] = (upstream["start_ns"] - picks[0]["start_ns"]) * NS
    phases["router_to_worker"] = (worker["start_ns"] - upstream["start_ns"]) * NS
    # The worker's events are in engine time; a loop running behind its clock stamps them earlier than
    # the wall clock saw them: add the lag back where it was incurred.
    lag_submit = float(attrs.get("simworker.lag_submit_s") or 0.0)
    lag_end_s = attrs.get("simworker.lag_end_s")
    lag_end = lag_submit if lag_end_s is None else float(lag_end_s)
    phases["worker_parse"] = (events["queue.start"] - worker["start_ns"]) * NS - frontend_wall + lag_submit
    phases["worker_frontend"] = frontend_wall
    phases["queue"] = (events["queue.end"] - events["queue.start"]) * NS
    phases["prefill"] = (events["prefill.end"] - events["prefill.start"]) * NS
    phases["decode"] = (events["decode.end"] - events["decode.start"]) * NS
    phases["worker_lag"] = lag_end - lag_submit
    phases["relay"] = (request["end_ns"] - events["decode.end"]) * NS - lag_end
    client = (by_name.get("client.turn") or [None])[0]
    if client is not None:
        phases["client_send"] = (request["start_ns"] - client["start_ns"]) * NS
        phases["client_receive"] = (client["end_ns"] - request["end_ns"]) * NS
        total = (client["end_ns"] - client["start_ns"]) * NS
        client_attrs = client.get("attributes", {})
        if "client.gap_s" in client_attrs:
            gap = float(client_attrs["client.gap_s"]) - float(client_attrs.get("client.tool_wait_s") or 0.0)
            phases[BETWEEN_TURNS] = gap
    else:
        total = (request["end_ns"] - request["start_ns"]) * NS
    return {**phases, "total": total, "speedup": speedup, "prompt_tokens": attrs.get("simworker.prompt_tokens")}


def summarize(rows: Sequence[Mapping[str, float | None]], speedup: float) -> dict:
    """Per phase over `rows` (wall seconds): mean, p50 and p90 in wall and simulated seconds, and the
    phase's share of the mean total; `unattributed` = total - the phases, per turn."""

    def stats(values: Sequence[float]) -> dict:
        return {
            "mean": round(statistics.fmean(values), 6),
            "p50": round(interpolated_percentile(values, 0.5), 6),
            "p90": round(interpolated_percentile(values, 0.9), 6),
        }

    totals = [float(r["total"] or 0.0) for r in rows]
    mean_total = statistics.fmean(totals) if totals else 0.0
    columns: dict[str, list[float]] = {name: [] for name in (*PHASES, "unattributed", "total", BETWEEN_TURNS)}
    for row in rows:
        seen = [float(row[name]) for name in PHASES if row.get(name) is not None]
        for name in (*PHASES, BETWEEN_TURNS):
            if row.get(name) is not None:
                columns[name].append(float(row[name]))
        columns["unattributed"].append(float(row["total"] or 0.0) - sum(seen))
        columns["total"].append(float(row["total"] or 0.0))
    out: dict = {"turns": len(rows), "speedup": speedup, "phases": {}}
    for name, values in columns.items():
        if not values:
            continue
        wall = stats(values)
        entry = {
            "turns": len(values),
            "wall_s": wall,
            "sim_s": {k: round(v * speedup, 6) for k, v in wall.items()},
            "share_of_total": round(statistics.fmean(values) / mean_total, 4) if mean_total > 0 else 0.0,
        }
        if name == "total":
            out["total"] = entry
        else:
            out["phases"][name] = entry
    return out


def breakdown_from_spans(paths: Sequence[str | Path], speedup: float | None = None) -> dict:
    """The live breakdown of every turn in the span files (or directories of them) `paths`. `speedup`:
    the workers' --speedup for the simulated-seconds columns; None = read from the worker spans."""
    traces: dict[str, list[dict]] = defaultdict(list)
    for span in read_spans(paths):
        traces[span["trace_id"]].append(span)
    rows = [row for trace in traces.values() if (row := turn_phases(trace)) is not None]
    if speedup is None:
        speedup = rows[0]["speedup"] if rows else 1.0
    out = summarize(rows, speedup)
    out["source"] = "live"
    out["traces"] = len(traces)
    return out


def breakdown_from_sim(result: "SimResult") -> dict:
    """The same breakdown from a simulated run's own event times (simulated seconds; wall = simulated /
    the scenario's live_speedup)."""
    speedup = result.scenario.live_speedup
    rows = [{k: (None if v is None else v / speedup) for k, v in row.items()} for row in result.turn_phases]
    out = summarize(rows, speedup)
    out["source"] = "sim"
    return out


def client_tracing(path: str | Path | None = None, service_name: str = "bandmaster-client"):
    """Write this process's spans (the player's `client.turn`) to `path`, else where BANDMASTER_TRACE_FILE
    says, as every service does; returns the Telemetry (`.provider.force_flush()` before reading the
    file, `.shutdown()` at the end), or None with neither. Once per process: the tracer provider is
    global. A process that runs several live stacks one after another keeps one client file and passes
    it with each stack's span directory to `breakdown_from_spans`: only the client spans of that
    stack's traces join."""
    import os

    from services.common.observe.telemetry import TRACE_FILE_ENV, setup_telemetry

    template = str(path) if path is not None else os.environ.get(TRACE_FILE_ENV)
    if not template:
        return None
    return setup_telemetry(service_name, env={**os.environ, TRACE_FILE_ENV: template})


_client_file: Path | None = None
_client_telemetry = None


class LiveSpans:
    """Span files for one live run, for a benchmark that starts stacks itself (bench/compare.py):

        spans = LiveSpans(state_dir / "spans")
        with spans:                      # processes started inside inherit BANDMASTER_TRACE_FILE
            stack = start_live_stack(...)
            ... play, stop the stack (a graceful stop flushes every service's spans) ...
        row["breakdown"] = spans.report(speedup)

    With `client=True` the benchmark's own process also writes the player's `client.turn` spans, to one
    file per process for all its runs (the tracer provider is global: `client_tracing` once); each
    report joins only its own run's traces."""

    def __init__(self, directory: str | Path, *, client: bool = True) -> None:
        self.directory = Path(directory)
        self.client = client
        self._saved: str | None = None

    def __enter__(self) -> "LiveSpans":
        import os

        from services.common.observe.telemetry import TRACE_FILE_ENV

        global _client_file, _client_telemetry
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.client and _client_telemetry is None:
            _client_file = self.directory.parent / f"client-{os.getpid()}.jsonl"
            _client_telemetry = client_tracing(_client_file)
        self._saved = os.environ.get(TRACE_FILE_ENV)
        os.environ[TRACE_FILE_ENV] = str(self.directory / "{service}-{pid}.jsonl")
        return self

    def __exit__(self, *exc_info) -> None:
        import os

        from services.common.observe.telemetry import TRACE_FILE_ENV

        if self._saved is None:
            os.environ.pop(TRACE_FILE_ENV, None)
        else:
            os.environ[TRACE_FILE_ENV] = self._saved

    def report(self, speedup: float | None = None) -> dict:
        """The run's breakdown (`breakdown_from_spans`), once its processes have stopped."""
        paths: list[Path] = [self.directory]
        if self.client and _client_telemetry is not None and _client_file is not None:
            _client_telemetry.provider.force_flush()
            paths.append(_client_file)
        return breakdown_from_spans(paths, speedup)


def format_table(report: dict) -> str:
    """Phases as rows: mean and p90 wall milliseconds, mean simulated seconds, share of the total."""
    lines = [f"{'phase':<22}{'wall ms mean':>14}{'p90':>10}{'sim s mean':>12}{'share':>8}"]
    rows = list(report["phases"].items()) + ([("total", report["total"])] if "total" in report else [])
    for name, entry in rows:
        wall = entry["wall_s"]
        lines.append(
            f"{name:<22}{wall['mean'] * 1000:>14.1f}{wall['p90'] * 1000:>10.1f}"
            f"{entry['sim_s']['mean']:>12.3f}{entry['share_of_total']:>8.1%}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.breakdown", description=__doc__.splitlines()[0])
    parser.add_argument("spans", nargs="+", type=Path, help="span files (JSON lines) or directories of them")
    parser.add_argument("--speedup", type=float, default=None, help="the workers' --speedup (default: from spans)")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    args = parser.parse_args(argv)
    if args.speedup is not None and args.speedup <= 0:
        print("bench.breakdown: invalid configuration: speedup: speedup > 0", file=sys.stderr)
        return 2
    report = breakdown_from_spans(args.spans, args.speedup)
    if not report["turns"]:
        print("bench.breakdown: no turn in those spans reached a worker", file=sys.stderr)
        return 1
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
    print(format_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
