"""`bandmaster batch submit --wait`: polls until the batch ends, shows progress (sparse off a terminal),
prints the final counts and output file id, exits non-zero unless completed, and Ctrl-C stops waiting
without cancelling the batch."""

import io
from types import SimpleNamespace

import pytest

from services.cli import SIGINT_EXIT, main
from services.cli.plan import wait_for_batch


def _batch(status, completed=0, failed=0, total=100, output=None, error=None):
    return SimpleNamespace(
        id="batch_1",
        status=status,
        request_counts=SimpleNamespace(total=total, completed=completed, failed=failed),
        output_file_id=output,
        error_file_id=error,
    )


class FakeClient:
    def __init__(self, states):
        self.states = list(states)
        self.retrieved = 0
        self.cancelled = []
        self.batches = SimpleNamespace(retrieve=self._retrieve, cancel=self.cancelled.append)

    def _retrieve(self, batch_id):
        assert batch_id == "batch_1"
        self.retrieved += 1
        return self.states.pop(0)


def test_wait_polls_to_the_end_and_prints_counts_and_the_output_file():
    states = [_batch("in_progress", n) for n in range(0, 100, 5)] + [_batch("completed", 98, 2, output="file_o")]
    client, stream, out, slept = FakeClient(states), io.StringIO(), io.StringIO(), []
    code = wait_for_batch(client, _batch("validating"), poll_s=0.5, stream=stream, out=out, sleep=slept.append)
    assert code == 0 and client.retrieved == 21 and slept == [0.5] * 21
    assert out.getvalue() == "batch_1 completed: 98/100 completed, 2 failed; output file file_o, error file -\n"
    lines = stream.getvalue().splitlines()
    # Off a terminal: a line per 10% step at most, not one per poll; the last shows every request done.
    assert 2 <= len(lines) <= 12 and "100/100" in lines[-1] and "\r" not in stream.getvalue()


@pytest.mark.parametrize("status", ["failed", "expired", "cancelled"])
def test_wait_exits_1_when_the_batch_did_not_complete(status):
    client, out = FakeClient([_batch(status, 3, error="file_e")]), io.StringIO()
    assert wait_for_batch(client, _batch("in_progress"), poll_s=1, stream=io.StringIO(), out=out, sleep=lambda s: None)
    assert f"batch_1 {status}: 3/100 completed" in out.getvalue() and "error file file_e" in out.getvalue()


def test_ctrl_c_stops_waiting_without_cancelling():
    client, stream = FakeClient([_batch("in_progress", 10)]), io.StringIO()
    calls = []

    def sleep(s):
        calls.append(s)
        if len(calls) == 2:
            raise KeyboardInterrupt

    code = wait_for_batch(client, _batch("in_progress"), poll_s=1, stream=stream, out=io.StringIO(), sleep=sleep)
    assert code == SIGINT_EXIT and client.cancelled == []
    assert "keeps running" in stream.getvalue() and "bandmaster batch cancel batch_1" in stream.getvalue()


def test_an_ended_batch_needs_no_poll():
    client = FakeClient([])
    assert wait_for_batch(client, _batch("completed", 100), poll_s=1, stream=io.StringIO(), out=io.StringIO()) == 0
    assert client.retrieved == 0


def test_a_bad_poll_interval_is_refused_before_any_call(tmp_path, capsys):
    f = tmp_path / "in.jsonl"
    f.write_text("{}\n")
    assert (
        main(["batch", "--base-url", "http://127.0.0.1:9/v1", "submit", str(f), "--wait", "--poll-seconds", "0"]) == 2
    )
    assert "poll_seconds" in capsys.readouterr().err
