"""bench.breakdown: joining span files per turn into phases, and the same phases from the simulator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.breakdown import PHASES, breakdown_from_sim, breakdown_from_spans, main, turn_phases
from harness.simlib import SimScenario, simulate
from harness.simlib.live_path import LivePathCosts, PhaseCost

DATA = Path(__file__).parent / "data" / "turn_spans.jsonl"
MS = 1_000_000  # ns


def _span(name, start_ms, end_ms, span_id, parent=None, attributes=None, events=None):
    return {
        "trace_id": "t1",
        "span_id": span_id,
        "parent_id": parent,
        "name": name,
        "start_ns": start_ms * MS,
        "end_ns": end_ms * MS,
        "attributes": attributes or {},
        "events": [{"name": n, "t_ns": t * MS, "attributes": {}} for n, t in (events or {}).items()],
    }


def _worker(parent, start_ms=40, end_ms=900, speedup=4.0, frontend_s=0.04, events=None, lags=None):
    events = events or {
        "queue.start": 60,
        "queue.end": 100,
        "prefill.start": 100,
        "prefill.end": 300,
        "decode.start": 300,
        "decode.end": 880,
    }
    attributes = {"simworker.speedup": speedup, "simworker.frontend_s": frontend_s, "simworker.prompt_tokens": 9}
    if lags is not None:
        attributes["simworker.lag_submit_s"], attributes["simworker.lag_end_s"] = lags
    return _span("POST /v1/chat/completions", start_ms, end_ms, "w", parent, attributes, events)


def _turn(client=True, admit=True, held_s=0.0):
    spans = [_span("router.request", 5, 895, "r")]
    if client:
        attrs = {"client.gap_s": 0.5, "client.tool_wait_s": 0.45}
        spans.append(_span("client.turn", 0, 897, "c", attributes=attrs))
        spans[0]["parent_id"] = "c"
    if admit:
        spans.append(_span("router.admit", 7, 17, "a", "r", {"router.held_seconds": held_s}))
    spans += [_span("router.pick", 18, 19, "p", "r"), _span("router.upstream", 20, 890, "u", "r"), _worker("u")]
    return spans


@pytest.mark.parametrize(
    "spans, expected",
    [
        (
            _turn(),
            # ms: client 0 -> router 5 -> admit 7..17 -> upstream 20 -> worker 40 -> queue 60 (less 10 ms of
            # modelled frontend = 0.04 s / 4) -> 100 -> 300 -> 880 -> router ends 895 -> client ends 897.
            dict(
                client_send=5,
                router_parse=2,
                admission_round_trip=10,
                admission_held=0,
                route=3,
                router_to_worker=20,
                worker_parse=10,
                worker_frontend=10,
                queue=40,
                prefill=200,
                decode=580,
                relay=15,
                client_receive=2,
                total=897,
                client_between_turns=50,
            ),
        ),
        (
            _turn(held_s=0.004),  # 4 of the admission's 10 ms held by the scheduler
            dict(admission_round_trip=6, admission_held=4, total=897),
        ),
        (
            _turn(client=False, admit=False),  # the kv arm, a client that sends no traceparent
            dict(
                client_send=None,
                router_parse=13,
                admission_round_trip=None,
                admission_held=None,
                route=2,
                client_receive=None,
                total=890,
            ),
        ),
    ],
)
def test_a_turns_phases_from_its_spans(spans, expected):
    row = turn_phases(spans)
    for name, ms in expected.items():
        if ms is None:
            assert row[name] is None, name
        else:
            assert row[name] == pytest.approx(ms / 1000, abs=1e-9), name


def test_a_worker_loop_behind_its_clock_gives_its_lag_back_to_the_phases_that_saw_it():
    # The loop was 5 ms behind at submission and 12 ms behind when the last output was read: its
    # events (engine time) are stamped that much earlier than the wall clock saw them.
    spans = [s for s in _turn() if s["span_id"] != "w"] + [_worker("u", lags=(0.005, 0.012))]
    row = turn_phases(spans)
    assert row["worker_parse"] == pytest.approx(0.015)
    assert row["worker_lag"] == pytest.approx(0.007)
    assert row["relay"] == pytest.approx(0.003)
    assert row["total"] - sum(row[p] for p in PHASES if row[p] is not None) == pytest.approx(0.0, abs=1e-9)
    zero_end = [s for s in _turn() if s["span_id"] != "w"] + [_worker("u", lags=(0.005, 0.0))]
    assert turn_phases(zero_end)["worker_lag"] == pytest.approx(-0.005)


def test_with_a_failover_the_last_attempt_counts():
    spans = _turn()
    first = _span("router.upstream", 18, 19, "u0", "r")
    spans += [first, _worker("u0", start_ms=18, end_ms=19, events={"queue.start": 18})]
    assert turn_phases(spans)["router_to_worker"] == pytest.approx(0.020)


@pytest.mark.parametrize(
    "spans",
    [
        [_span("scheduler.tick", 0, 1, "s")],  # not a turn
        [s for s in _turn() if s["name"] != "POST /v1/chat/completions"],  # never reached a worker (or real SGLang)
        [*(s for s in _turn() if s["span_id"] != "w"), _worker("u", events={"queue.start": 60})],  # aborted queued
    ],
)
def test_traces_that_are_not_a_served_turn_are_left_out(spans):
    assert turn_phases(spans) is None


def test_a_recorded_live_turn_adds_up(tmp_path):
    """One turn of a Bandmaster run (client, router, scheduler, simworker spans) and a scheduler tick,
    recorded with BANDMASTER_TRACE_FILE."""
    report = breakdown_from_spans([DATA])
    assert report["turns"] == 1 and report["traces"] == 2 and report["speedup"] == 4.0
    phases = report["phases"]
    assert set(PHASES) <= set(phases)
    assert abs(phases["unattributed"]["wall_s"]["mean"]) < 1e-6
    decode = phases["decode"]
    assert decode["sim_s"]["mean"] == pytest.approx(decode["wall_s"]["mean"] * 4, rel=1e-5)
    assert all(p["wall_s"]["mean"] >= 0 for name, p in phases.items() if name != "unattributed")
    # A directory of span files reads the same; the CLI writes the report.
    (tmp_path / "spans").mkdir()
    (tmp_path / "spans" / "router.jsonl").write_text(DATA.read_text())
    out = tmp_path / "report.json"
    assert main([str(tmp_path / "spans"), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["phases"]["decode"] == decode


def test_no_turn_in_the_files_is_an_error(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main([str(empty)]) == 1
    assert main([str(DATA), "--speedup", "0"]) == 2


def _scenario(programs=2, **kw) -> SimScenario:
    return SimScenario(arm="kv", workload="short", programs=programs, max_turns=2, workers=1, live_speedup=4.0, **kw)


def test_the_simulators_breakdown_accounts_for_every_turn():
    result = simulate(_scenario())
    report = breakdown_from_sim(result)
    assert report["turns"] == result.run.summary()["turns_ok"] == len(result.turn_phases)
    assert abs(report["phases"]["unattributed"]["sim_s"]["mean"]) < 1e-6
    # The client's turn time, from the same records.
    assert report["total"]["sim_s"]["mean"] == pytest.approx(
        sum(t.turn_s for t in result.run.turns) / len(result.run.turns), abs=1e-3
    )
    assert "relay" not in report["phases"]  # no live path modelled


def test_the_live_path_model_puts_its_costs_in_the_turns_timeline():
    costs = LivePathCosts(
        router_parse=PhaseCost(),  # the calibrated defaults off: only what this test sets
        admission_round_trip=PhaseCost(),
        client_send=PhaseCost(base_s=0.010),
        router_to_worker=PhaseCost(base_s=0.002),
        worker_parse=PhaseCost(per_prompt_token_s=1e-6),
        relay=PhaseCost(per_output_token_s=1e-4),
    )
    # One program alone on its worker: the engine's part of each turn is the same in both runs, and the
    # modelled path adds exactly its costs (wall x speedup 4) before the engine and after the last token.
    plain, live = simulate(_scenario(programs=1)), simulate(_scenario(programs=1, live_path=costs))
    assert len(live.turn_phases) == len(live.run.turns) == 2
    for phases, turn, before in zip(live.turn_phases, live.run.turns, plain.run.turns):
        assert phases["client_send"] == pytest.approx(0.040)
        assert phases["router_to_worker"] == pytest.approx(0.008)
        assert phases["worker_parse"] == pytest.approx(4e-6 * phases["prompt_tokens"])
        assert phases["relay"] == pytest.approx(4e-4 * turn.completion_tokens)
        extra = phases["client_send"] + phases["router_to_worker"] + phases["worker_parse"] + phases["relay"]
        assert turn.turn_s == pytest.approx(before.turn_s + extra, abs=2e-4)
        assert phases["total"] == pytest.approx(turn.turn_s, abs=1e-4)
    assert live.run.wall_s > plain.run.wall_s


def test_another_variant_draws_each_turns_path_costs_about_their_means_on_the_same_workload():
    from harness.simlib import Simulator

    costs = LivePathCosts(
        router_parse=PhaseCost(),
        admission_round_trip=PhaseCost(),
        router_to_worker=PhaseCost(),
        worker_parse=PhaseCost(),
        relay=PhaseCost(),
        client_send=PhaseCost(base_s=0.010),
    )
    means = simulate(_scenario(programs=1, live_path=costs))
    drawn = [simulate(_scenario(programs=1, live_path=costs, variant=v)) for v in (1, 2)]
    sent = [[p["client_send"] for p in r.turn_phases] for r in (means, *drawn)]
    assert sent[0] == pytest.approx([0.040, 0.040])  # variant 0: each turn pays the mean
    assert sent[1] != sent[2] and all(s > 0 for s in sent[1] + sent[2])  # others: a draw per turn
    # The same programs, turn for turn: only the timing moved.
    for r in drawn:
        assert [(t.prompt_tokens, t.completion_tokens) for t in r.run.turns] == [
            (t.prompt_tokens, t.completion_tokens) for t in means.run.turns
        ]
    # The draws keep the mean: exponential of mean 1 times the wall cost times the speedup.
    sim = Simulator(_scenario(programs=1, live_path=costs, variant=3))
    assert sum(sim._path_scale() for _ in range(20_000)) / 20_000 == pytest.approx(4.0, rel=0.03)
    # Without the live path model there is nothing to draw: the variant's run is variant 0's.
    assert simulate(_scenario(variant=2)).run.wall_s == simulate(_scenario()).run.wall_s


def test_a_negative_variant_is_a_config_error():
    from services.common.settings.errors import ConfigError

    with pytest.raises(ConfigError, match="variant >= 0"):
        _scenario(variant=-1)


def test_the_calibrated_defaults_cost_something_on_every_phase():
    costs = LivePathCosts()
    assert costs.before_admission_wall_s(10_000, scheduled=True) > costs.before_admission_wall_s(10_000, False) > 0
    assert costs.dispatch_wall_s(20_000) > costs.dispatch_wall_s(1_000) > 0
    assert costs.relay_wall_s(10_000, 100) > 0


def test_a_negative_cost_is_a_config_error():
    from services.common.settings.errors import ConfigError

    with pytest.raises(ConfigError, match="base_s >= 0"):
        PhaseCost(base_s=-0.001)


def test_the_model_calibrates_from_a_live_breakdown_report():
    from harness.simlib.live_path import costs_from_breakdown
    from services.common.settings.errors import ConfigError

    report = breakdown_from_spans([DATA])
    means = {name: entry["wall_s"]["mean"] for name, entry in report["phases"].items()}
    costs = costs_from_breakdown(report)
    assert costs.client_send == PhaseCost(base_s=means["client_send"])
    assert costs.router_to_worker.base_s == pytest.approx(means["route"] + means["router_to_worker"])
    relay = means["relay"] + means["client_receive"] + means.get("client_between_turns", 0.0)
    assert costs.relay.base_s == pytest.approx(relay)
    assert costs.relay.per_prompt_token_s == 0.0
    # A lag that shrank (negative mean) costs nothing; a phase the report lacks costs nothing.
    shrunk = {"phases": {"worker_lag": {"wall_s": {"mean": -0.5}}, "worker_parse": {"wall_s": {"mean": 0.1}}}}
    assert costs_from_breakdown(shrunk).worker_parse.base_s == 0.0
    assert costs_from_breakdown(shrunk).admission_round_trip == PhaseCost()
    with pytest.raises(ConfigError):
        costs_from_breakdown({"turns": 0})


def test_live_spans_sets_the_trace_file_for_processes_started_inside_and_restores_it(tmp_path, monkeypatch):
    import os

    from bench.breakdown import LiveSpans
    from services.common.observe.telemetry import TRACE_FILE_ENV

    monkeypatch.setenv(TRACE_FILE_ENV, "/elsewhere/{pid}.jsonl")
    spans = LiveSpans(tmp_path / "run1", client=False)
    with spans:
        assert os.environ[TRACE_FILE_ENV] == str(tmp_path / "run1" / "{service}-{pid}.jsonl")
        (tmp_path / "run1" / "bandmaster-router-1.jsonl").write_text(DATA.read_text())
    assert os.environ[TRACE_FILE_ENV] == "/elsewhere/{pid}.jsonl"
    assert spans.report()["turns"] == 1


@pytest.mark.parametrize("argv", [["--programs", "0"], ["--max-turns", "0"], ["--speedup", "0"]])
def test_the_live_point_refuses_a_bad_point_before_starting_anything(argv, tmp_path, capsys):
    from bench.breakdown_live import main as live_main

    assert live_main([*argv, "--out-dir", str(tmp_path)]) == 2
    assert "invalid configuration" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
