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
