"""`Program.snapshot`: the copy an admission keeps to roll back to, as `dataclasses.replace` made it."""

import dataclasses

from services.scheduler.core.model import Lifecycle, Program, ReplicaKey, Status


def test_a_snapshot_is_an_equal_independent_copy_of_every_field():
    program = Program(
        "s",
        "parent",
        1.5,
        7,
        status=Status.ACTING,
        lifecycle=Lifecycle.PAUSED,
        token_total=900,
        tokens_estimated=False,
        replica=ReplicaKey("w1", 0),
        last_replica=ReplicaKey("w2", 1),
        marked=True,
        soft_demoted_until=3.0,
        pause_protected_until=4.0,
        admission_epoch=5,
        turns=6,
        last_activity=8.0,
        acting_since=9.0,
        paused_since=10.0,
    )
    copy = program.snapshot()
    assert copy == dataclasses.replace(program) and copy is not program
    assert all(getattr(copy, f.name) == getattr(program, f.name) for f in dataclasses.fields(Program))
    program.turns += 1
    assert copy.turns == 6
