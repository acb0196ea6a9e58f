"""bench/sim_scale.py: the smoke run writes a complete report; bad arguments exit 2."""

import json

from bench import sim_scale
from harness.simlib.scenario import ARMS


def test_smoke_report_has_every_arm_and_the_decode_run_check(tmp_path, capsys):
    out = tmp_path / "sim_scale.json"
    assert sim_scale.main(["--smoke", "--jobs", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    # Every arm but the oracle, the peers (thunderagent, continuum) included.
    assert [row["arm"] for row in report["arms"]] == [a for a in ARMS if a != "oracle"]
    assert {"bandmaster", "kv", "round_robin", "thunderagent", "continuum"} <= {row["arm"] for row in report["arms"]}
    for row in report["arms"]:
        assert row["completed"] and row["turns"] > 0 and row["cpu_s"] >= 0
        assert row["prompt_tokens"] >= row["prefilled_tokens"] > 0
    check = report["decode_runs"]
    assert check["identical_results"] is True
    assert check["decode_runs"]["events"] < check["single_steps"]["events"]
    assert "decode runs: identical=True" in capsys.readouterr().out


def test_unknown_arm_is_refused(capsys):
    assert sim_scale.main(["--smoke", "--arms", "bandmaster,fastest"]) == 2
    assert "--arms" in capsys.readouterr().err


def test_fleet_smoke_reports_every_size_and_the_ratios(tmp_path, capsys):
    out = tmp_path / "sim_fleet.json"
    assert sim_scale.main(["--fleet", "--smoke", "--jobs", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["benchmark"] == "sim_fleet"
    assert [p["workers"] for p in report["points"]] == list(sim_scale.SMOKE_FLEET.workers)
    for point in report["points"]:
        # The same oversubscription and programs per slot at every size: both scale with the workers.
        assert point["parallel"] == round(sim_scale.SMOKE_FLEET.factor * point["workers"])
        assert point["programs"] == 8 * point["workers"]
        assert sorted(point["arms"]) == sorted(sim_scale.FLEET_ARMS)
        for row in point["arms"].values():
            assert row["completed"] and row["turns"] == point["programs"] * 3
            assert row["steady_steps_per_min"] > 0  # fewer slots than programs: a steady window
        assert point["bandmaster_over_kv"] > 0 and point["bandmaster_over_oracle"] > 0
    assert report["points"][0]["gain_over_smallest"] == 1.0
    assert report["targets"]["cpu"] == "PASS" and report["targets"]["gain"] in ("PASS", "MISS")
    assert "targets: CPU PASS" in capsys.readouterr().out


def _row(arm, workers, steady, cpu_s):
    return {"arm": arm, "workers": workers, "steady_steps_per_min": steady, "steps_per_min": 1.0, "cpu_s": cpu_s}


def test_fleet_ratios_and_verdicts():
    rows = [
        _row("bandmaster", 2, 120.0, 10.0),
        _row("kv", 2, 100.0, 8.0),
        _row("oracle", 2, 150.0, 5.0),
        _row("bandmaster", 32, 1_700.0, 400.0),
        _row("kv", 32, 1_600.0, 200.0),
        _row("oracle", 32, 2_400.0, 100.0),
    ]
    small, large = sim_scale.fleet_points(rows)
    assert (small["bandmaster_over_kv"], small["bandmaster_over_oracle"], small["kv_over_oracle"]) == (1.2, 0.8, 0.667)
    assert small["gain_over_smallest"] == 1.0 and small["bandmaster_cpu_over_kv"] == 1.25
    # 1.0625 / 1.2: the gain shrank by 11% -> a miss; 400 CPU s > 300 -> a miss.
    assert large["bandmaster_over_kv"] == 1.062 and large["gain_over_smallest"] == 0.885
    verdicts = sim_scale.fleet_verdicts([small, large])
    assert (verdicts["cpu"], verdicts["gain"], verdicts["cpu_s_per_arm_at_largest"]) == ("MISS", "MISS", 400.0)
    # Without a steady window a point falls back to steps/min over the makespan.
    no_window = sim_scale.fleet_points([{**rows[0], "steady_steps_per_min": None}, rows[1]])
    assert no_window[0]["bandmaster_over_kv"] == 0.01


def test_bad_fleet_workers_are_refused(capsys):
    assert sim_scale.main(["--fleet", "--smoke", "--fleet-workers", "2,x"]) == 2
    assert sim_scale.main(["--fleet", "--smoke", "--fleet-workers", "0,2"]) == 2
    assert "--fleet-workers" in capsys.readouterr().err
