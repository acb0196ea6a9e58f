"""Docs that run: the commands of README.md and docs/getting-started.md are executed as written.

Every bash block a reader is told to run carries a doc-run marker (scripts/doc_markers.py): it is run
here, verbatim, in a scratch directory with the test venv's `bandmaster` (tests/support/doc_run.py), or
skipped with a reason. A walkthrough that stops working, or a bash block added without a marker, fails.

The pages tell readers the default ports (8000, 50051, ...), so the runs need them: when one is taken
(another cluster on a shared machine) the run is skipped, naming the port, rather than failing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.doc_markers import doc_blocks, unmarked_shell_blocks
from services.common.serve.ports import DEFAULT_PORTS, port_free
from tests.support.doc_run import run_page, venv_dir

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "docs" / "getting-started.md"]

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_bash_block_is_run_or_skipped_with_a_reason(page):
    assert unmarked_shell_blocks(page.read_text()) == []
    assert any(b.options is not None and not b.skipped for b in doc_blocks(page.read_text()))


def _default_ports_free() -> None:
    ports = {**DEFAULT_PORTS, "simworker+1": DEFAULT_PORTS["simworker"] + 1}
    taken = [f"{name} {port}" for name, port in ports.items() if not port_free("127.0.0.1", port)]
    if taken:
        pytest.skip(f"the pages use the default ports and these are taken on this machine: {', '.join(taken)}")
    if not (venv_dir() / "bin" / "bandmaster").exists():
        pytest.skip(f"no `bandmaster` console script in {venv_dir() / 'bin'} (the project is not installed)")


def test_readme_runs(tmp_path):
    _default_ports_free()
    ran = run_page(ROOT / "README.md", tmp_path)
    assert any("bandmaster up" in command for command in ran)
    assert any(command.startswith("python ") for command in ran)


def test_getting_started_runs_and_shows_the_scheduler_at_work(tmp_path):
    """The walkthrough end to end; in section 6 every benched program finishes (`programs_done` is all of
    them, bench exits 0) and the scheduler paused some on the way (`status`: pauses > 0): the `# expect:`
    patterns of that block."""
    _default_ports_free()
    ran = run_page(ROOT / "docs" / "getting-started.md", tmp_path)
    bench = [command for command in ran if "bandmaster bench" in command or "status --once" in command]
    assert len(bench) == 2 and all("# expect:" in command for command in bench)


SERVER = "python -c 'import time; print(\"serving\", flush=True); time.sleep(60)'"


def _page(tmp_path: Path, blocks: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(f"# Page\n\n{blocks}")
    return page


def test_the_runner_runs_verbatim_in_a_scratch_dir_and_stops_the_background_with_ctrl_c(tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    page = _page(
        tmp_path,
        f'<!-- doc-run: name=server background ready="^serving" timeout=30 -->\n```bash\n{SERVER}\n```\n\n'
        "<!-- doc-run: name=use -->\n```bash\n"
        "test -x .venv/bin/bandmaster && pwd   # expect: scratch$\n"
        "echo one \\\n  two   # expect: ^one two$\n```\n\n"
        '<!-- doc-run: name=py expect="^3$" -->\n```python\nprint(1 + 2)\n```\n',
    )
    ran = run_page(page, scratch)
    assert ran[0] == SERVER and ran[-1] == "python py.py" and len(ran) == 4


@pytest.mark.parametrize(
    ("block", "why"),
    [
        ("<!-- doc-run: name=f -->\n```bash\necho out; exit 3\n```\n", "exited 3"),
        ("<!-- doc-run: name=e -->\n```bash\necho something   # expect: other\n```\n", "does not match 'other'"),
        ("<!-- doc-run: name=t timeout=1 -->\n```bash\nsleep 30\n```\n", "still running after 1 s"),
        (
            "<!-- doc-run: name=s background ready=never timeout=2 -->\n```bash\nsleep 30\n```\n",
            "printing 'never'",
        ),
        (
            "<!-- doc-run: name=d background ready=^x -->\n```bash\n"
            'python -c \'import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); print("x", flush=True);'
            " time.sleep(60)'\n```\n",
            "did not stop within",
        ),
    ],
)
def test_the_runner_fails_naming_the_block(tmp_path, monkeypatch, block, why):
    import tests.support.doc_run as doc_run

    monkeypatch.setattr(doc_run, "STOP_GRACE_S", 2.0)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with pytest.raises(Exception, match=why) as failure:
        run_page(_page(tmp_path, block), scratch)
    assert "page.md" in str(failure.value)
