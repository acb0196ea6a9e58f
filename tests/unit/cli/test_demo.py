"""`bandmaster demo`: the side-by-side table, the verdict lines and the starvation warning."""

from __future__ import annotations

import argparse

import pytest

from services.cli import demo
from services.launcher import probes


def summary(steps_per_min: float, late: float | None = 0.01, **extra) -> dict:
    return {
        "programs_done": 2,
        "programs_total": 2,
        "turns_ok": 10,
        "turns_failed": 0,
        "steps_per_min": steps_per_min,
        "program_time_p50_s": 10.0,
        "program_time_p90_s": 20.0,
        "ttft_p50_s": 0.5,
        "ttft_p90_s": 1.0,
        "kv_hit_rate": 0.9,
        "worker_recomputed_tokens": 100,
        "late_fraction": late,
        **extra,
    }


def test_table_has_both_arms_and_the_ratio():
    text = demo.results_table({"bandmaster": summary(60.0, pauses=3, resumes=3), "kv": summary(50.0)})
    assert "Bandmaster" in text and "KV routing only" in text and "ratio" in text
    steps = next(line for line in text.splitlines() if line.startswith("steps per minute"))
    assert steps.rstrip().endswith("1.20x")
    assert "3 / 3" in text  # pauses / resumes of the scheduler arm


def test_single_arm_table_has_no_ratio_column():
    assert "ratio" not in demo.results_table({"kv": summary(50.0)})


def test_verdict_states_ratio_and_prediction():
    predicted = {"bandmaster": demo.Prediction((40.0, 44.0, 46.0)), "kv": demo.Prediction((41.0, 40.0, 39.0))}
    lines = demo.verdict({"bandmaster": summary(60.0), "kv": summary(50.0)}, predicted)
    assert lines[0] == "Bandmaster ran 1.20x the steps per minute of KV-aware routing alone."
    # The ratio of the arms' medians, with each arm's range over the seeds.
    assert "predicts 1.10x" in lines[1]
    assert "44.0 vs 40.0 steps/min, medians of 3 draws; Bandmaster 40.0-46.0, KV 39.0-41.0" in lines[1]
    assert not any("WARNING" in line for line in lines)
    one = demo.verdict(
        {"bandmaster": summary(60.0), "kv": summary(50.0)}, {a: demo.Prediction((2.0,)) for a in ("bandmaster", "kv")}
    )
    assert "1.00x" in one[1] and "one draw" in one[1]


@pytest.mark.parametrize(
    "late, busy, warned",
    [(None, None, False), (0.05, 0.5, False), (0.10, 0.9, False), (0.25, 0.5, True), (0.01, 0.97, True)],
)
def test_starvation_warning(late, busy, warned):
    lines = demo.verdict({"bandmaster": summary(60.0, late=late, cpu_busy=busy), "kv": summary(50.0)}, None)
    assert any("CPU-starved" in line for line in lines) is warned


def test_busy_share_from_proc_stat_samples():
    assert probes.busy_share((10.0, 100.0), (55.0, 200.0)) == pytest.approx(0.45)
    assert probes.busy_share(None, (1.0, 2.0)) is None
    assert probes.busy_share((1.0, 2.0), (1.0, 2.0)) is None
    sample = probes.cpu_times()
    assert sample is None or 0 <= sample[0] <= sample[1]


def test_parser_defaults_and_bad_arms(capsys):
    parser = argparse.ArgumentParser()
    demo.add_parser(parser.add_subparsers())
    args = parser.parse_args(["demo"])
    assert (args.arms, args.programs, args.max_turns, args.worker_speedup, args.worker_kv_tokens) == (
        "bandmaster,kv",
        18,
        32,
        10.0,
        65_536,
    )
    bad = parser.parse_args(["demo", "--arms", "bandmaster,nope"])
    assert demo.run(bad) == 2
    assert "--arms" in capsys.readouterr().err


def test_the_prediction_models_the_live_paths_own_costs(monkeypatch):
    import harness.simlib as simlib
    from harness.simlib.live_path import LivePathCosts

    seen = []

    class _Result:
        def summary(self) -> dict:
            return {"steps_per_min": 1.0}

    def fake_simulate(scenario):
        seen.append(scenario)
        return _Result()

    monkeypatch.setattr(simlib, "simulate", fake_simulate)
    parser = argparse.ArgumentParser()
    demo.add_parser(parser.add_subparsers())
    args = parser.parse_args(["demo", "--programs", "2", "--max-turns", "2", "--predict-draws", "3"])
    assert demo.predict(args, ["bandmaster", "kv"]) == {
        "bandmaster": demo.Prediction((1.0, 1.0, 1.0)),
        "kv": demo.Prediction((1.0, 1.0, 1.0)),
    }
    # The live run pays the client, router, admission and relay costs `speedup` times over: so does the prediction.
    assert all(s.live_path == LivePathCosts() for s in seen)
    assert {s.live_speedup for s in seen} == {10.0}
    # Each arm under variants 1..3 of seed 0: the same programs, other draws of the path's timing.
    assert [(s.arm, s.seed, s.variant) for s in seen] == [(a, 0, k) for a in ("bandmaster", "kv") for k in (1, 2, 3)]
    assert len({(s.programs, s.max_turns, s.workload, s.token_scale) for s in seen}) == 1


def test_prediction_median_and_the_draw_count_is_checked(capsys):
    assert demo.Prediction((3.0, 1.0, 2.0)).median == 2.0
    assert demo.Prediction((1.0, 4.0)).median == 2.5
    parser = argparse.ArgumentParser()
    demo.add_parser(parser.add_subparsers())
    assert parser.parse_args(["demo"]).predict_draws == demo.PREDICT_DRAWS
    for bad in ("0", "-1", "x", "51"):
        with pytest.raises(SystemExit):
            parser.parse_args(["demo", "--predict-draws", bad])
        assert "--predict-draws: must be an integer from 1 to 50" in capsys.readouterr().err


def test_without_the_simulator_the_demo_runs_with_no_prediction(monkeypatch, capsys):
    """A runtime install carries no harness/: the prediction is skipped with a note, the demo still runs."""
    import sys

    # A None entry in sys.modules makes `import harness...` raise ModuleNotFoundError, as an install without it does.
    for name in [m for m in sys.modules if m == "harness" or m.startswith("harness.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "harness", None)
    parser = argparse.ArgumentParser()
    demo.add_parser(parser.add_subparsers())
    args = parser.parse_args(["demo", "--programs", "2", "--max-turns", "2"])
    assert demo.predict(args, ["bandmaster", "kv"]) is None
    assert "development tool" in capsys.readouterr().out
