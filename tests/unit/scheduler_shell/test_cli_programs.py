"""`bandmaster programs` against a real in-process scheduler."""

import argparse
import asyncio

import pytest

from services.cli import programs as cli_programs
from tests.unit.scheduler_shell.test_servicer import fill

pytestmark = pytest.mark.timeout(30)


def _parse(argv):
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    cli_programs.add_parser(commands)
    return parser.parse_args(argv)


async def test_programs_prints_the_tree_and_replica_bands(h, capsys):
    await h.set_capacity({("w1", 0): 1_000, ("w1", 1): 1_000})
    await fill(h, 700, "root", worker="w1", dp_rank=0)
    await h.admit("kid", "k1", 50, parent="root")
    await h.admit("grandkid", "g1", 20, parent="kid")
    args = _parse(["programs", "--scheduler-addr", h.running.address])
    assert await asyncio.to_thread(args.run, args) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    root_at = next(i for i, line in enumerate(lines) if line.startswith("root "))
    assert lines[root_at + 1].startswith("└ kid ") and lines[root_at + 2].startswith("  └ grandkid ")
    assert "800" not in lines[root_at] and "700" in lines[root_at] and "acting" in lines[root_at]
    assert lines[root_at + 1].split()[2:6] == ["active", "reasoning", "50", "yes"]
    assert "replicas (2)" in out and "soft_demote" in out and "normal" in out
    header = next(line for line in lines if line.startswith("worker"))
    assert header.split() == [
        "worker",
        "dp",
        "retention",
        "used",
        "used_decayed",
        "util",
        "band",
        "in_flight",
        "resident",
        "passthrough",
        "max",
    ]


def test_programs_reports_an_unreachable_scheduler(capsys):
    args = _parse(["programs", "--scheduler-addr", "127.0.0.1:1", "--timeout-seconds", "0.5"])
    assert args.run(args) == 1
    err = capsys.readouterr().err
    assert "127.0.0.1:1" in err and ("UNAVAILABLE" in err or "DEADLINE_EXCEEDED" in err)
