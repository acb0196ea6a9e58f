"""`bandmaster trace`: choosing one turn in span files and printing its tree (pure), and the command."""

from __future__ import annotations

import json

import pytest

from services.cli import main
from services.cli.trace import build_tree, read_spans, render, select_trace

MS = 1_000_000


def span(trace, sid, parent, name, service, start_ms, end_ms, **attributes):
    return {
        "trace_id": trace,
        "span_id": sid,
        "parent_id": parent,
        "name": name,
        "service": f"bandmaster-{service}",
        "kind": "INTERNAL",
        "start_ns": start_ms * MS,
        "end_ns": end_ms * MS,
        "status": "UNSET",
        "attributes": attributes,
        "events": [],
    }


T1, T2, T3 = "1" * 32, "2" * 32, "3" * 32
ROUTER = [
    span(T1, "r1", None, "router.request", "router", 0, 100, **{"router.request_id": "a", "router.session_id": "s"}),
    span(T1, "r2", "r1", "router.admit", "router", 1, 10),
    span(T1, "r3", "r1", "router.upstream", "router", 12, 99),
    span(T2, "q1", None, "router.request", "router", 200, 300, **{"router.request_id": "b", "router.session_id": "s"}),
    span(T3, "q9", None, "router.request", "router", 400, 450, **{"router.request_id": "c"}),
]
SCHEDULER = [
    span(T1, "s1", "r2", "scheduler.admit", "scheduler", 2, 9),
    span("9" * 32, "t1", None, "scheduler.tick", "scheduler", 500, 501),
]
WORKER = [span(T1, "w1", "r3", "POST /v1/chat/completions", "simworker", 14, 98)]
ALL = ROUTER + SCHEDULER + WORKER


@pytest.mark.parametrize(
    "kwargs, trace",
    [
        ({}, T3),  # the last turn, not the later background tick
        ({"request_id": "a"}, T1),
        ({"request_id": "2222"}, T2),  # a trace id prefix
        ({"session_id": "s"}, T2),  # its last turn
        ({"session_id": "s", "turn": 1}, T1),
        ({"session_id": "s", "turn": 2}, T2),
        ({"session_id": "s", "turn": -2}, T1),
    ],
)
def test_select_trace(kwargs, trace):
    assert select_trace(ALL, **kwargs) == trace


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"request_id": "zz"}, "no turn has request id"),
        ({"session_id": "nope"}, "no turn of session"),
        ({"session_id": "s", "turn": 3}, "has 2 turns"),
        ({"session_id": "s", "turn": 0}, "has 2 turns"),
    ],
)
def test_select_trace_says_what_it_did_not_find(kwargs, message):
    with pytest.raises(LookupError, match=message):
        select_trace(ALL, **kwargs)
    with pytest.raises(LookupError, match="no turn in these files"):
        select_trace(SCHEDULER)


def test_the_tree_merges_the_services_and_nests_by_parent():
    (root,) = build_tree(ALL, T1)
    assert root.record["name"] == "router.request"
    assert [c.record["name"] for c in root.children] == ["router.admit", "router.upstream"]
    assert [c.record["name"] for c in root.children[0].children] == ["scheduler.admit"]
    assert [c.record["name"] for c in root.children[1].children] == ["POST /v1/chat/completions"]


def test_a_span_whose_parent_is_in_no_file_is_a_root():
    roots = build_tree(SCHEDULER + WORKER, T1)
    assert [r.record["name"] for r in roots] == ["scheduler.admit", "POST /v1/chat/completions"]


def test_render_indents_with_offsets_and_durations():
    lines = render(build_tree(ALL, T1))
    width = len("   └─ POST /v1/chat/completions")
    assert [line[:width].rstrip() for line in lines] == [
        "router.request",
        "├─ router.admit",
        "│  └─ scheduler.admit",
        "└─ router.upstream",
        "   └─ POST /v1/chat/completions",
    ]
    assert "router" in lines[0] and "+      0.0 ms" in lines[0] and "100.0 ms" in lines[0]
    assert "scheduler" in lines[2] and "+      2.0 ms" in lines[2] and "7.0 ms" in lines[2]
    with_attributes = render(build_tree(ALL, T1), attributes=True)
    assert "│  router.request_id=a" in with_attributes


def test_read_spans_skips_a_cut_line(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps(ROUTER[0]) + "\n" + '{"trace_id": "1' + "\n\n")
    spans, bad = read_spans([path])
    assert spans == [ROUTER[0]] and bad == 1


def test_the_command_prints_one_turn_from_several_files(tmp_path, capsys):
    for name, records in (("router", ROUTER), ("scheduler", SCHEDULER), ("simworker", WORKER)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    files = [arg for name in ("router", "scheduler") for arg in ("--file", str(tmp_path / f"{name}.jsonl"))]
    assert main(["trace", *files, "--file", str(tmp_path / "simworker.jsonl"), "--session-id", "s", "--turn", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"trace {T1}  request_id=a  session_id=s"
    assert len(out) == 6 and "scheduler.admit" in out[3] and "POST /v1/chat/completions" in out[5]
    assert main(["trace", "--dir", str(tmp_path), "--request-id", "c"]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("router.request")
    assert main(["trace", "--dir", str(tmp_path), "--request-id", "zz"]) == 1
    assert "no turn has request id or trace id 'zz' (8 spans in 3 files)" in capsys.readouterr().err
    assert main(["trace", "--dir", str(tmp_path), "--turn", "1"]) == 2
