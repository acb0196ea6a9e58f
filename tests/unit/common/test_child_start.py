"""The one launcher: stdin closed, output appended to the log (or truncated, or discarded), env and cwd as given."""

from __future__ import annotations

import sys

from services.common.process.child_start import start_child
from services.common.process.child_stop import stop_child

PRINT = (
    "import os, sys; print(os.getcwd(), os.environ.get('MARK'), sys.stdin.read() == ''); print('err', file=sys.stderr)"
)


def test_output_goes_to_the_log_appended_with_env_and_cwd(tmp_path):
    log = tmp_path / "child.log"
    log.write_text("earlier run\n")
    process = start_child([sys.executable, "-c", PRINT], log, env={"MARK": "m1"}, cwd=tmp_path)
    assert process.wait(timeout=30) == 0
    lines = log.read_text().splitlines()
    assert lines[0] == "earlier run" and sorted(lines[1:]) == sorted([f"{tmp_path} m1 True", "err"])


def test_truncate_starts_the_log_empty_and_none_discards(tmp_path):
    log = tmp_path / "child.log"
    log.write_text("earlier run\n")
    assert start_child([sys.executable, "-c", "print('x')"], log, truncate=True).wait(timeout=30) == 0
    assert log.read_text() == "x\n"
    assert start_child([sys.executable, "-c", "print('y')"], None, cwd=tmp_path).wait(timeout=30) == 0
    assert list(tmp_path.iterdir()) == [log]


def test_a_started_child_is_stopped_by_the_one_stopper(tmp_path):
    process = start_child([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "sleep.log")
    assert stop_child(process, 5.0, name="sleeper") and process.returncode is not None
