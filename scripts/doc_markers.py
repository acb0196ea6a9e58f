"""Markers in Markdown pages: the generated part of a page (the lines between a BEGIN and an END marker),
and the doc-run markers that say which of a page's fenced blocks the docs test runs (below).

Shared by the generators in scripts/ (metrics_table.py and flags_table.py write a section of a page,
grafana_dashboard.py a whole file): `--write` rewrites, `--check` exits 1 when the committed text
differs.
"""

from __future__ import annotations

import argparse
import pathlib
import shlex
import sys
from dataclasses import dataclass


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


# ---------------------------------------------------------------------------------------------------------------
# Docs that run: the fenced blocks of a page that tests/integration/test_docs_run.py executes or skips.
# ---------------------------------------------------------------------------------------------------------------

DOC_RUN = "doc-run:"
"""A block a reader is told to run carries a marker on the line just above its fence:

    <!-- doc-run: name=cluster background ready="Ctrl-C to stop" timeout=90 -->
    <!-- doc-run: skip reason="installs on a fresh machine" -->

`name` (a run block: unique on its page) and, optionally, `timeout` (seconds, for the whole block or, in
the background, until ready), `background` (started and left running until a later block's `stop=NAME` or
the end of the page; `ready` is a regular expression its output must match first), `interactive` (a live
view: started, interrupted with SIGINT once `ready` matches), `stop=NAME[,NAME]` (Ctrl-C those background
blocks before this one runs), `expect` (a regular expression the block's output must match). In a bash
block a command's own `# expect: REGEX` comment checks that command's output; bash ignores it."""

RUN_KEYS = frozenset({"name", "timeout", "background", "interactive", "ready", "stop", "expect"})
RUN_LANGUAGES = frozenset({"bash", "python"})
DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class DocBlock:
    """One fenced block of a page: where its fence is (1-based line), its language, its text and
    its doc-run marker's options (None when it has none)."""

    line: int
    lang: str
    text: str
    options: dict[str, str] | None

    @property
    def skipped(self) -> bool:
        return self.options is not None and "skip" in self.options

    @property
    def name(self) -> str:
        return (self.options or {}).get("name", f"line {self.line}")

    @property
    def timeout_s(self) -> float:
        return float((self.options or {}).get("timeout", DEFAULT_TIMEOUT_S))

    def commands(self) -> list[tuple[str, str | None]]:
        """A bash block's commands, one per logical line (a trailing backslash continues it), each with
        its `# expect:` regular expression or None; blank and comment-only lines are no command."""
        found: list[tuple[str, str | None]] = []
        pending = ""
        for raw in self.text.splitlines():
            pending += raw
            if pending.endswith("\\"):
                pending = pending[:-1] + " "
                continue
            command, pending = pending.strip(), ""
            if command and not command.startswith("#"):
                _, marker, expect = command.partition("# expect:")
                found.append((command, expect.strip() if marker else None))
        return found


def parse_run_marker(comment: str) -> dict[str, str]:
    """The options of one `<!-- doc-run: ... -->` marker (`key=value`, quoted values allowed; a bare word
    is `true`). Raises ValueError on an unknown key, a skip without a reason, a run block without a name,
    or a background or interactive block without `ready`."""
    body = comment.strip().removeprefix("<!--").removesuffix("-->").strip()
    if not body.startswith(DOC_RUN):
        raise ValueError(f"not a {DOC_RUN} marker: {comment!r}")
    options: dict[str, str] = {}
    for word in shlex.split(body[len(DOC_RUN) :]):
        key, _, value = word.partition("=")
        options[key] = value if _ else "true"
    if "skip" in options:
        if not options.get("reason") or set(options) != {"skip", "reason"}:
            raise ValueError(f"a skip marker takes exactly a non-empty reason=...: {comment!r}")
        return options
    unknown = set(options) - RUN_KEYS
    if unknown:
        raise ValueError(f"unknown doc-run option(s) {sorted(unknown)} in {comment!r} (known: {sorted(RUN_KEYS)})")
    if not options.get("name"):
        raise ValueError(f"a doc-run block needs name=...: {comment!r}")
    if ("background" in options or "interactive" in options) and not options.get("ready"):
        raise ValueError(f"a background or interactive block needs ready=REGEX: {comment!r}")
    float(options.get("timeout", DEFAULT_TIMEOUT_S))  # ValueError when it is no number
    return options


def doc_blocks(page: str) -> list[DocBlock]:
    """Every fenced block of `page`, in order, with the doc-run marker on the line just above its fence.

    Raises ValueError on a marker that does not sit on a fence, an invalid marker, a marked block in a
    language the runner cannot run, or two run blocks with one name."""
    lines = page.splitlines()
    blocks: list[DocBlock] = []
    names: set[str] = set()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith(f"<!-- {DOC_RUN}"):
            if i + 1 >= len(lines) or not lines[i + 1].startswith("```"):
                raise ValueError(f"line {i + 1}: a doc-run marker must sit on the line just above a ``` fence")
        if not line.startswith("```"):
            i += 1
            continue
        lang = line[3:].strip()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            raise ValueError(f"line {i + 1}: the fence is never closed")
        previous = lines[i - 1].strip() if i else ""
        options = parse_run_marker(previous) if previous.startswith(f"<!-- {DOC_RUN}") else None
        block = DocBlock(i + 1, lang, "\n".join(lines[i + 1 : end]), options)
        if options is not None and not block.skipped:
            if lang not in RUN_LANGUAGES:
                raise ValueError(f"line {i + 1}: doc-run runs {sorted(RUN_LANGUAGES)} blocks, not {lang!r}")
            if block.name in names:
                raise ValueError(f"line {i + 1}: a second doc-run block named {block.name!r}")
            names.add(block.name)
        blocks.append(block)
        i = end + 1
    return blocks


def unmarked_shell_blocks(page: str) -> list[DocBlock]:
    """The bash blocks of `page` that are neither run nor skipped: each must be one or the other."""
    return [b for b in doc_blocks(page) if b.lang in ("bash", "sh", "shell", "console") and b.options is None]
