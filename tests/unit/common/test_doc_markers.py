"""scripts/doc_markers.py: the generated sections and files behind docs/metrics.md, docs/flags.md
and the Grafana dashboard."""

from __future__ import annotations

import pytest

from scripts.doc_markers import begin_marker, end_marker, generate, run, splice


def _page(body: str) -> str:
    return f"# T\n\nintro\n\n{begin_marker('s')}\n{body}\n{end_marker('s')}\n\nafter\n"


def test_splice_replaces_only_the_section():
    assert splice(_page("old"), "s", "new\n") == _page("new")


@pytest.mark.parametrize(
    "page", ["no markers", _page("x") + begin_marker("s"), _page("x").replace(end_marker("s"), "")]
)
def test_splice_refuses_missing_or_repeated_markers(page):
    with pytest.raises(ValueError):
        splice(page, "s", "body")


def test_check_reports_a_stale_section_and_write_fixes_it(tmp_path, capsys):
    path = tmp_path / "page.md"
    path.write_text(_page("old"))
    assert run(path, "s", "new", ["--check"], "gen.py") == 1
    assert "run `python gen.py --write`" in capsys.readouterr().err
    assert path.read_text() == _page("old")
    assert run(path, "s", "new", ["--write"], "gen.py") == 0
    assert path.read_text() == _page("new")
    assert run(path, "s", "new", [], "gen.py") == 0


def test_generate_writes_a_whole_file_and_its_folder(tmp_path):
    path = tmp_path / "a" / "b.json"
    assert generate(path, "{}\n", [], "gen.py", "x") == 1
    assert generate(path, "{}\n", ["--write"], "gen.py", "x") == 0
    assert path.read_text() == "{}\n"
    assert generate(path, "{}\n", ["--check"], "gen.py", "x") == 0
