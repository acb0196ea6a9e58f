"""Replace the generated part of a Markdown page: the lines between a BEGIN and an END marker.

Shared by the generators in scripts/ (metrics_table.py and flags_table.py write a section of a page,
grafana_dashboard.py a whole file): `--write` rewrites, `--check` exits 1 when the committed text
differs.
"""

from __future__ import annotations

import argparse
import pathlib
import sys


def begin_marker(section: str) -> str:
    return f"<!-- BEGIN GENERATED {section}: edit the source, then run the script named here -->"


def end_marker(section: str) -> str:
    return f"<!-- END GENERATED {section} -->"


def splice(page: str, section: str, body: str) -> str:
    """`page` with the text between the markers of `section` replaced by `body`.

    Raises ValueError when the markers are missing, repeated or out of order, so a page
    whose markers were edited away is reported instead of being silently appended to."""
    begin, end = begin_marker(section), end_marker(section)
    if page.count(begin) != 1 or page.count(end) != 1:
        raise ValueError(f"expected exactly one {begin!r} and one {end!r}")
    head, rest = page.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body.rstrip()}\n{end}{tail}"


def generate(path: pathlib.Path, wanted: str, argv: list[str] | None, script: str, what: str) -> int:
    """The command line of a generator whose output is `wanted`, the whole of `path`:
    --check (default) exits 1 when the committed file differs, --write rewrites it."""
    parser = argparse.ArgumentParser(description=f"Generate {what}")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite it in place")
    mode.add_argument("--check", action="store_true", help="exit 1 if the committed file is stale (default)")
    args = parser.parse_args(argv)
    current = path.read_text() if path.exists() else ""
    if args.write:
        if wanted != current:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(wanted)
            print(f"{path}: {what} rewritten")
        return 0
    if wanted != current:
        print(f"{path}: {what} is stale; run `python {script} --write`", file=sys.stderr)
        return 1
    return 0


def run(path: pathlib.Path, section: str, body: str, argv: list[str] | None, script: str) -> int:
    """`generate` for one marked section of a Markdown page."""
    return generate(path, splice(path.read_text(), section, body), argv, script, f"the {section} section")
