"""`bandmaster plan` renders the last tick with provenance and unknown-is-not-zero; `bandmaster batch`
refuses a malformed window before any call; both find addresses in `bandmaster up`'s state dir."""

import json

import pytest

from bandmaster.planner.v1 import planner_pb2 as pb
from services.cli import main
from services.cli.plan import render


def _plan() -> pb.Plan:
    plan = pb.Plan(
        decision_id="planner-7",
        action="apply",
        fail_closed_reasons=["policy_safety_pause"],
        policy_reasons=["deadline infeasible: batch_1"],
        has_replica_floor=True,
        replica_floor=3,
        has_scale_to=True,
        scale_to=3,
        effects_outcome="applied",
        required_batch_rps=float("inf"),
        planned_batch_capacity_rps=12.5,
        minimum_deadline_slack_s=-4,
        tick_seconds=0.012,
    )
    plan.leases.add(max_admission_rps=0, writer_epoch=1, writer_sequence=9)
    plan.targets.add(
        source="load",
        provenance=pb.PROVENANCE_PROPOSE,
        kind="SET",
        replicas=2,
        effect="opinion",
        reason="kv usage 0.95 > 0.9",
        replayed=True,
    )
    plan.targets.add(
        source="native_batch_policy",
        provenance=pb.PROVENANCE_RECONCILE,
        kind="AT_LEAST",
        replicas=3,
        effect="raised_to_floor",
        reason="floor",
    )
    plan.targets.add(source="final", provenance=pb.PROVENANCE_FAIL_CLOSED, kind="SET", replicas=3, effect="final")
    plan.observation.CopyFrom(
        pb.ObservationSummary(
            jobs_known=True,
            active_jobs=1,
            remaining_requests=40,
            traffic_known=False,
            inventory_known=True,
            ready_replicas=2,
            desired_replicas=-1,
            source_errors=["router: warming up"],
        )
    )
    plan.proposer_reasons["programs"] = "no scheduler"
    return plan


def test_render_shows_the_decision_its_provenance_and_what_was_unknown():
    text = render(_plan())
    for expected in (
        "planner-7",
        "0 rps (epoch 1, seq 9)",
        "floor 3",
        "scaled to 3",
        "policy_safety_pause",
        "deadline infeasible",
        "required inf rps",
        "load (replayed)",
        "PROPOSE",
        "RECONCILE",
        "raised_to_floor",
        "FAIL_CLOSED",
        "desired unknown",
        "router: warming up",
        "no scheduler",
    ):
        assert expected in text, expected
    online = next(line for line in text.splitlines() if "online traffic" in line)
    assert "unknown" in online and "0.00" not in online


def test_plan_reads_the_planner_address_from_the_state_dir(tmp_path, capsys):
    (tmp_path / "planner.ready.json").write_text(json.dumps({"grpc": "127.0.0.1:1"}))
    assert main(["plan", "--state-dir", str(tmp_path), "--timeout-seconds", "0.5"]) == 1
    assert "127.0.0.1:1: UNAVAILABLE" in capsys.readouterr().err


@pytest.mark.parametrize("window", ["24", "h", "1w", "-1h", ""])
def test_batch_submit_refuses_a_malformed_window(tmp_path, window, capsys):
    path = tmp_path / "in.jsonl"
    path.write_text("{}\n")
    assert main(["batch", "--base-url", "http://127.0.0.1:1/v1", "submit", str(path), f"--window={window}"]) == 2
    assert "window" in capsys.readouterr().err
