"""Group `services/common/` and the router shell into folders named by their job: a re-runnable codemod.

    python scripts/regroup.py            # move the modules and rewrite every reference to them
    python scripts/regroup.py --check    # exit 1 if anything is left to move or rewrite; change nothing

`GROUPS` is the whole plan: for each of the two packages, the folders it gets and the modules that go into
each. A module keeps its file name (`services/router/turns.py` -> `services/router/turn/turns.py`), so a bare
mention of it (`turns.py` in a comment) stays true. The script

1. makes each folder a package (an `__init__.py` whose docstring says the folder's job, when it has none),
2. `git mv`s each module that is still at its old place (one already moved is left alone; one at both places
   is an error to settle by hand),
3. rewrites every reference in the tracked text files (code, tests, scripts, docs, deploy files, pyproject's
   import contracts): `from services.router import session, validation` is split by the module's new
   package, and each old dotted name (`services.common.config`) and path (`services/common/config.py`) becomes
   its new one,
4. sorts the imports and formats the Python files it changed (ruff).

Re-running it is safe and is the way to bring a branch written against the old layout up to date: merge the
branch, run the script, commit. No old name is a prefix of a new one (no folder is named like a module it
replaces), so a rewritten name is never rewritten twice; `--check` after a run reports nothing.
"""

from __future__ import annotations

import argparse
import ast
import pathlib
import re
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parent.parent
SELF = pathlib.Path(__file__).resolve().relative_to(ROOT).as_posix()

# package -> {folder: (docstring of the folder's __init__.py, [modules moved into it])}
GROUPS: dict[str, dict[str, tuple[str, list[str]]]] = {
    "services/common": {
        "settings": (
            "Settings: flags and environment mapped onto config dataclasses, the one ConfigError, the shared "
            "KvRouter flags.",
            ["config", "errors", "kv_router_flags"],
        ),
        "auth": (
            "Who may call and over what: TLS, bearer tokens and the bind rule, the local CA, credentials kept "
            "out of errors and logs.",
            ["security", "certs", "redact"],
        ),
        "observe": (
            "What a process tells about itself: OpenTelemetry set-up and span export, logging, loop lag, process "
            "metrics.",
            ["telemetry", "trace_export", "logs", "loop_lag", "process_metrics"],
        ),
        "serve": (
            "Serving a gRPC service: the server host, the entry point, listening ports, domain errors as gRPC "
            "status, the health probe.",
            ["grpc_server", "entrypoint", "ports", "grpc_errors", "healthcheck"],
        ),
        "process": (
            "Child processes: starting one, stopping it with bounded waits, dying with the parent, the ready file.",
            ["child_start", "child_stop", "orphan_guard", "ready"],
        ),
        "outbound": (
            "Calling other Bandmaster services: the capacity watch, following the scheduler's leader, the retry "
            "policy, why a TLS call failed.",
            ["capacity_watch", "leader_follow", "retry", "tls_diagnosis"],
        ),
        "web": (
            "The HTTP edges: OpenAI-style error bodies, bounded JSON bodies, the session headers.",
            ["http_errors", "openai_errors", "json_body", "session_ids"],
        ),
        "sglang": (
            "The SGLang side: reaching workers (API key, TLS), their KV-event wire format, the model's tokenizer.",
            ["worker_client", "kv_events", "tokenizer"],
        ),
    },
    "services/router": {
        "ingress": (
            "Requests in: the public HTTP port and API (OpenAI, SGLang), the gRPC Router service, field rules.",
            ["http_api", "http_server", "grpc_api", "validation"],
        ),
        "turn": (
            "One agent turn, whatever API it came in on: its session and prompt, admit -> pick -> bind -> stream "
            "-> complete, the SSE relay.",
            ["turns", "open_turn", "relay", "turn_types", "session", "prompts"],
        ),
        "workers": (
            "The workers in rotation: the fleet view over capacity snapshots, circuit breakers, health probes.",
            ["fleet", "circuits", "health"],
        ),
        "observe": (
            "What the router tells about itself: its metrics, its lean tracer, credentials redacted from logs.",
            ["metrics", "lean_tracer", "redaction"],
        ),
    },
}

SKIP_PREFIXES = ("bandmaster/",)  # generated protobuf code
LINE_LENGTH = 120  # pyproject's [tool.ruff] line-length
PYTHON_PACKAGES_WITH_MOVES = tuple(package.replace("/", ".") for package in GROUPS)


def plan() -> dict[str, str]:
    """Old module path -> new module path (both 'services/common/config.py' style)."""
    moves: dict[str, str] = {}
    for package, folders in GROUPS.items():
        for folder, (_doc, modules) in folders.items():
            for module in modules:
                moves[f"{package}/{module}.py"] = f"{package}/{folder}/{module}.py"
    return moves


def dotted(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def check_plan(moves: dict[str, str]) -> None:
    """A folder named like a module it replaces would make a rewritten name look old again."""
    olds = {dotted(o) for o in moves}
    for new in moves.values():
        parts = dotted(new).split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix in olds:
                raise SystemExit(f"plan error: the new name {dotted(new)} starts with the old module {prefix}")


def git(*args: str, check: bool = True) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise SystemExit(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


# -- 1 and 2: packages and moves ---------------------------------------------------------------------


def make_packages(dry: bool) -> list[str]:
    todo = []
    for package, folders in GROUPS.items():
        for folder, (doc, _modules) in folders.items():
            init = ROOT / package / folder / "__init__.py"
            if init.exists():
                continue
            todo.append(f"create {init.relative_to(ROOT)}")
            if not dry:
                init.parent.mkdir(parents=True, exist_ok=True)
                init.write_text("\n".join(textwrap.wrap(f'"""{doc}"""', LINE_LENGTH)) + "\n")
                git("add", str(init.relative_to(ROOT)))
    return todo


def move_modules(moves: dict[str, str], dry: bool) -> list[str]:
    todo = []
    for old, new in moves.items():
        old_exists, new_exists = (ROOT / old).exists(), (ROOT / new).exists()
        if old_exists and new_exists:
            raise SystemExit(f"both {old} and {new} exist: merge them by hand, delete {old}, and run again")
        if old_exists:
            todo.append(f"git mv {old} {new}")
            if not dry:
                git("mv", old, new)
    return todo


# -- 3: references -----------------------------------------------------------------------------------


def split_from_imports(text: str, moves: dict[str, str]) -> str:
    """`from services.router import session, config` -> one statement per package the names now live in."""
    moved = {dotted(o): dotted(n) for o, n in moves.items()}
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    lines = text.splitlines(keepends=True)
    edits = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in PYTHON_PACKAGES_WITH_MOVES):
            continue
        if not any(f"{node.module}.{a.name}" in moved for a in node.names):
            continue
        first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1
        head, tail = lines[first][: node.col_offset], lines[last][node.end_col_offset :]
        if head.strip() or (tail.strip() and not tail.strip().startswith("#")):
            raise SystemExit(f"cannot split an import that shares its line: {lines[first].strip()!r}")
        by_package: dict[str, list[str]] = {}
        for a in node.names:
            target = moved.get(f"{node.module}.{a.name}")
            package = target.rsplit(".", 1)[0] if target else node.module
            by_package.setdefault(package, []).append(a.name + (f" as {a.asname}" if a.asname else ""))
        comment = f"  {tail.strip()}" if tail.strip() else ""
        statements = [f"{head}from {package} import {', '.join(names)}" for package, names in by_package.items()]
        statements[0] += comment
        edits.append((first, last, "".join(s + "\n" for s in statements)))
    for first, last, replacement in sorted(edits, reverse=True):
        lines[first : last + 1] = [replacement]
    return "".join(lines)


def name_rewriter(moves: dict[str, str]):
    """One regex for every old dotted name and path; a match must not be part of a longer name."""
    table = {dotted(o): dotted(n) for o, n in moves.items()}
    table.update(moves)
    table.update({dotted(o).replace(".", "\\."): dotted(n).replace(".", "\\.") for o, n in moves.items()})  # in a regex
    alternatives = "|".join(re.escape(old) for old in sorted(table, key=len, reverse=True))
    pattern = re.compile(rf"(?<![\w./])({alternatives})(?![\w])")

    # `from services.common import orphan_guard` where no parser sees it (in a string, a doc): one name only.
    modules = {dotted(o): dotted(n) for o, n in moves.items()}
    moved_from = {f"from {o.rsplit('.', 1)[0]} import {o.rsplit('.', 1)[1]}": n for o, n in modules.items()}
    packages = "|".join(re.escape(p) for p in PYTHON_PACKAGES_WITH_MOVES)
    from_pattern = re.compile(rf"\bfrom ({packages}) import (\w+)(?![\w,])")

    def from_sub(m: re.Match[str]) -> str:
        new = moved_from.get(m.group(0))
        return f"from {new.rsplit('.', 1)[0]} import {m.group(2)}" if new else m.group(0)

    def rewrite(text: str) -> str:
        return from_pattern.sub(from_sub, pattern.sub(lambda m: table[m.group(1)], text))

    return rewrite


def wrap_long_prose(text: str, new_names: tuple[str, ...]) -> str:
    """Break a comment line or a docstring line that a rewrite pushed past LINE_LENGTH at its last space that
    fits (a longer name made it longer); code lines are left to the formatter."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    prose: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            prose.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    out = []
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        body = line.rstrip("\n")
        stripped = body.lstrip()
        comment = stripped.startswith("#")
        if len(body) <= LINE_LENGTH or not (comment or number in prose) or not any(n in body for n in new_names):
            out.append(line)
            continue
        indent = body[: len(body) - len(stripped)]
        prefix = indent + ("# " if comment else "")
        while len(body) > LINE_LENGTH:
            cut = body.rfind(" ", len(prefix) + 1, LINE_LENGTH + 1)
            if cut < 0:
                break
            out.append(body[:cut] + "\n")
            body = prefix + body[cut + 1 :]
        out.append(body + line[len(line.rstrip("\n")) :])
    return "".join(out)


def tracked_text_files() -> list[str]:
    out = []
    for name in git("ls-files", "-z").split("\0"):
        if not name or name == SELF or name.startswith(SKIP_PREFIXES) or not (ROOT / name).is_file():
            continue
        out.append(name)
    return out


def rewrite_references(moves: dict[str, str], dry: bool) -> list[str]:
    rewrite = name_rewriter(moves)
    new_names = tuple(moves.values()) + tuple(dotted(n) for n in moves.values())
    changed = []
    for name in tracked_text_files():
        path = ROOT / name
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        new = split_from_imports(text, moves) if name.endswith(".py") else text
        new = rewrite(new)
        if name.endswith(".py") and new != text:
            new = wrap_long_prose(new, new_names)
        if new != text:
            changed.append(name)
            if not dry:
                path.write_text(new, encoding="utf-8")
    return changed


# -- 4: tidy -----------------------------------------------------------------------------------------


def tidy(python_files: list[str]) -> None:
    if not python_files:
        return
    ruff = pathlib.Path(sys.executable).with_name("ruff")
    command = [str(ruff)] if ruff.exists() else [sys.executable, "-m", "ruff"]
    subprocess.run([*command, "check", "--quiet", "--select", "I", "--fix", *python_files], cwd=ROOT, check=False)
    subprocess.run([*command, "format", "--quiet", *python_files], cwd=ROOT, check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report what is left to do; change nothing")
    args = parser.parse_args(argv)
    moves = plan()
    check_plan(moves)
    todo = make_packages(args.check) + move_modules(moves, args.check)
    changed = rewrite_references(moves, args.check)
    todo += [f"rewrite {name}" for name in changed]
    if not args.check:
        tidy([name for name in changed if name.endswith(".py")])
    for line in todo:
        print(line)
    print(f"{len(todo)} step(s) {'left' if args.check else 'done'}")
    return 1 if args.check and todo else 0


if __name__ == "__main__":
    sys.exit(main())
