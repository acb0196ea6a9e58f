"""scripts/doc_markers.py: the generated sections and files behind docs/metrics.md, docs/flags.md
and the Grafana dashboard, and the doc-run markers of the pages whose commands the docs test runs."""

from __future__ import annotations

import pytest

from scripts.doc_markers import (
    begin_marker,
    doc_blocks,
    end_marker,
    generate,
    parse_run_marker,
    run,
    splice,
    unmarked_shell_blocks,
)


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


PAGE = """# Page

<!-- doc-run: skip reason="needs a GPU" -->
```bash
gpu-thing
```

<!-- doc-run: name=up background ready="Ctrl-C to stop" timeout=90 -->
```bash
bandmaster up --speedup 10   # a comment, not an expectation
```

```
output, not a command
```

<!-- doc-run: name=use stop=up expect="done" -->
```bash
# a comment line
curl -s http://x/v1/models   # expect: "id": ?"m"
curl -s http://x \\
     -d '{"a": 1}'   # expect: choices

echo done
```

```bash
unmarked
```
"""


def test_doc_blocks_reads_fences_markers_and_commands():
    skipped, up, output, use, unmarked = doc_blocks(PAGE)
    assert skipped.skipped and skipped.options == {"skip": "true", "reason": "needs a GPU"}
    assert (up.name, up.timeout_s, up.options["ready"], up.options["background"]) == (
        "up",
        90.0,
        "Ctrl-C to stop",
        "true",
    )
    assert up.commands() == [("bandmaster up --speedup 10   # a comment, not an expectation", None)]
    assert (output.lang, output.options) == ("", None)
    assert use.options["stop"] == "up" and use.line == 18
    assert use.commands() == [
        ('curl -s http://x/v1/models   # expect: "id": ?"m"', '"id": ?"m"'),
        ("""curl -s http://x       -d '{"a": 1}'   # expect: choices""", "choices"),
        ("echo done", None),
    ]
    assert unmarked_shell_blocks(PAGE) == [unmarked]


@pytest.mark.parametrize(
    ("marker", "why"),
    [
        ("<!-- doc-run: skip -->", "reason"),
        ('<!-- doc-run: skip reason="" -->', "reason"),
        ("<!-- doc-run: timeout=5 -->", "name="),
        ("<!-- doc-run: name=a colour=red -->", "unknown"),
        ("<!-- doc-run: name=a background -->", "ready="),
        ("<!-- doc-run: name=a interactive -->", "ready="),
        ("<!-- doc-run: name=a timeout=soon -->", "float"),
    ],
)
def test_invalid_markers_are_refused(marker, why):
    with pytest.raises(ValueError, match=why):
        parse_run_marker(marker)


@pytest.mark.parametrize(
    ("page", "why"),
    [
        ("<!-- doc-run: name=a -->\ntext\n```bash\nx\n```\n", "just above"),
        ("<!-- doc-run: name=a -->\n```bash\nx\n", "never closed"),
        ("<!-- doc-run: name=a -->\n```yaml\nx: 1\n```\n", "not 'yaml'"),
        ("<!-- doc-run: name=a -->\n```bash\nx\n```\n<!-- doc-run: name=a -->\n```bash\ny\n```\n", "second"),
    ],
)
def test_misplaced_or_repeated_markers_are_refused(page, why):
    with pytest.raises(ValueError, match=why):
        doc_blocks(page)
