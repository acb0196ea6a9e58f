"""bench.foresight: the study hands each program's remaining turns to the scheduler's tail test and
to the engines' queues for the length of a run, and puts everything back afterwards."""

import json

import pytest

from bench import foresight
from bench.foresight import Foresight, _foresight, variant_foresight
from harness.simlib import simulator as sim
from services.capacity.core import cards
from services.scheduler.core import accounting
from services.simworker.core import engine


def test_variants_name_their_arm_and_what_they_are_told():
    assert variant_foresight("kv") == ("kv", Foresight())
    assert variant_foresight("kv+queue") == ("kv", Foresight(queue=True))
    assert variant_foresight("tail+queue") == ("bandmaster", Foresight(tail=True, queue=True))
    assert variant_foresight("parking+tail") == ("bandmaster", Foresight(tail=True, gpu_only_budget=True))


def test_everything_swapped_is_put_back():
    before = (sim.Simulator._on_admit, sim.Simulator._on_arrive, accounting.Ledger.is_tail, cards.host_counted)
    with pytest.raises(RuntimeError):
        with _foresight(Foresight(tail=True, queue=True, gpu_only_budget=True)):
            assert cards.host_counted(None, None) == 0
            raise RuntimeError("a failing run")
    assert (sim.Simulator._on_admit, sim.Simulator._on_arrive, accounting.Ledger.is_tail, cards.host_counted) == before


def test_queue_foresight_gives_each_turn_its_programs_remaining_turns(monkeypatch):
    seen: list[int | None] = []
    submit = engine.SimEngine.submit

    def spy(self, request, now):
        seen.append(request.priority)
        return submit(self, request, now)

    monkeypatch.setattr(engine.SimEngine, "submit", spy)
    spec = foresight.QUICK.with_fits([])
    variant, draw, steps = foresight.run_one(("kv+queue", 0, spec, 2, 0, None, foresight.load_config([], {})))
    assert (variant, draw) == ("kv+queue", 0) and steps > 0
    # QUICK programs run 3 turns each: every program's turns arrive as 3, 2, 1 turns left.
    assert seen and set(seen) == {1, 2, 3} and seen.count(3) == seen.count(1)
    seen.clear()
    foresight.run_one(("kv", 0, spec, 2, 0, None, foresight.load_config([], {})))
    assert set(seen) == {None}  # untold: KV routing sends no priority


def test_the_cli_writes_every_variant_against_kv(tmp_path, capsys):
    out = tmp_path / "foresight.json"
    assert foresight.main(["--quick", "--host", "--draws", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert list(report["variants"]) == list(foresight.VARIANTS)
    assert report["variants"]["kv"]["ratio_to_kv"] == [1.0]
    assert "parking+tail" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, rule",
    [
        (["--variants", "parking"], "parking variants need --host"),
        (["--variants", "oracle"], "each of kv, bandmaster"),
        (["--draws", "0"], "draws >= 1"),
    ],
)
def test_bad_arguments_are_refused_naming_the_rule(argv, rule, capsys):
    assert foresight.main(["--quick", *argv]) == 2
    assert rule in capsys.readouterr().err
