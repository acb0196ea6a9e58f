"""The command line ends as Unix tools do: into a closed pipe (`bandmaster trace | head`) quietly with
141, on Ctrl-C (even while it is still importing) with one line and 130; never with a traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from services import cli
from tests.support.processes import ROOT, base_env, python_module


def _into_closed_pipe(*args: str) -> subprocess.CompletedProcess:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the command writes a byte
    try:
        return subprocess.run(
            python_module("services.cli", *args),
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env=base_env(),
            cwd=ROOT,
            timeout=60,
        )
    finally:
        os.close(write_end)


def test_output_into_a_closed_pipe_ends_quietly(tmp_path):
    spans = tmp_path / "router.jsonl"
    record = {"trace_id": "1" * 32, "parent_id": None, "service": "bandmaster-router", "start_ns": 0, "end_ns": 1}
    lines = [{**record, "span_id": f"{i:016x}", "name": f"router.request.{i}"} for i in range(2000)]
    lines[0]["name"] = "router.request"
    lines[1:] = [{**line, "parent_id": lines[0]["span_id"]} for line in lines[1:]]
    spans.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = _into_closed_pipe("trace", "--file", str(spans), "--attributes")
    assert result.returncode == cli.SIGPIPE_EXIT, result.stderr
    assert result.stderr == "", result.stderr  # no traceback, no "Exception ignored"
    result = _into_closed_pipe("--help")  # argparse's exit, with the write still buffered
    assert result.returncode in (0, cli.SIGPIPE_EXIT) and result.stderr == "", result.stderr


def test_an_interrupt_while_the_commands_are_imported_is_one_line(monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("services.cli.help.CliParser.__init__", interrupted)
    assert cli.main(["status"]) == cli.SIGINT_EXIT
    assert capsys.readouterr().err == "bandmaster: interrupted\n"


@pytest.mark.parametrize("delay_s", [0.05, 0.3, 0.6, 2.0])
def test_ctrl_c_at_any_moment_is_one_line_and_130(delay_s):
    # `trace --file /dev/stdin` waits for its input: a command that is busy until interrupted.
    process = subprocess.Popen(
        python_module("services.cli", "trace", "--file", "/dev/stdin"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=base_env(),
        cwd=ROOT,
    )
    try:
        time.sleep(delay_s)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
        process.wait()
    if process.returncode == -signal.SIGINT:
        return  # so early that Python had not installed its handler yet: the default action, no output
    if "init_import_site" in err:
        return  # still in the interpreter's own start-up (site-packages), before any code of ours runs
    assert "Traceback" not in err, err
    assert process.returncode == cli.SIGINT_EXIT, err
    assert err == "bandmaster: interrupted\n"
