"""The one ready-file writer: atomic, nothing for an empty path, no temporary file left behind on failure."""

from __future__ import annotations

import json

import pytest

from services.common.ready import write_ready_file


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
