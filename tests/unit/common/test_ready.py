"""The one ready-file writer (atomic, nothing for an empty path, no temporary file left behind on failure) and
the one reader (None until a JSON object is there; a bounded wait that stops when the process exits)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from services.common.process.ready import read_ready_file, wait_ready_file, write_ready_file


def test_writes_json_atomically_and_replaces(tmp_path):
    path = tmp_path / "ready.json"
    write_ready_file(str(path), {"service": "x", "pid": 1})
    write_ready_file(str(path), {"service": "x", "pid": 2})
    assert json.loads(path.read_text()) == {"service": "x", "pid": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["ready.json"]


def test_empty_path_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_ready_file("", {"pid": 1})
    assert list(tmp_path.iterdir()) == []


def test_unserialisable_payload_leaves_no_temporary_file(tmp_path):
    with pytest.raises(TypeError):
        write_ready_file(str(tmp_path / "ready.json"), {"pid": object()})
    assert list(tmp_path.iterdir()) == []


def test_the_reader_sees_what_the_writer_wrote_and_none_before(tmp_path):
    path = tmp_path / "ready.json"
    assert read_ready_file(path) is None
    write_ready_file(str(path), {"grpc": "127.0.0.1:1", "port": 2})
    assert read_ready_file(path) == read_ready_file(str(path)) == {"grpc": "127.0.0.1:1", "port": 2}


@pytest.mark.parametrize("text", ["", "{not json", "[1, 2]", "null"])
def test_the_reader_takes_anything_but_a_json_object_for_not_there(tmp_path, text):
    path = tmp_path / "ready.json"
    path.write_text(text)
    assert read_ready_file(path) is None


def test_the_wait_returns_the_payload_once_written(tmp_path):
    path = tmp_path / "ready.json"
    writer = threading.Timer(0.1, write_ready_file, (str(path), {"port": 7}))
    writer.start()
    try:
        assert wait_ready_file(path, 10.0, interval_s=0.01) == {"port": 7}
    finally:
        writer.cancel()


def test_the_wait_is_bounded_and_stops_when_the_process_is_gone(tmp_path):
    path = tmp_path / "ready.json"
    start = time.monotonic()
    assert wait_ready_file(path, 0.1, interval_s=0.01) is None
    assert time.monotonic() - start < 5.0
    calls = []
    assert wait_ready_file(path, 60.0, alive=lambda: calls.append(1) or len(calls) < 3, interval_s=0.01) is None
    assert len(calls) == 3
