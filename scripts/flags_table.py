"""Every service's flags, environment variables and defaults, read from the services' Setting tables.

    python scripts/flags_table.py --write    # rewrite the tables in docs/flags.md
    python scripts/flags_table.py --check    # exit 1 if docs/flags.md is stale

The tables are the `SETTINGS` lists that `parse_settings` maps flags and environment variables
from, so they are the services' command lines exactly: a setting added, renamed or given another
default without regenerating the page fails tests/unit/common/test_flags_doc.py.
"""

from __future__ import annotations

import importlib
import pathlib
import sys
from typing import Any, Sequence

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from scripts.doc_markers import run  # noqa: E402

DOC = ROOT / "docs" / "flags.md"
SECTION = "flags tables (scripts/flags_table.py)"

# (title, command, module with SETTINGS)
COMMANDS = (
    ("capacity", "python -m services.capacity", "services.capacity.config"),
    ("scheduler", "python -m services.scheduler", "services.scheduler.config"),
    ("router", "python -m services.router", "services.router.config"),
    ("planner", "python -m services.planner", "services.planner.config"),
    ("batch", "python -m services.batch", "services.batch.config"),
    ("simworker", "python -m services.simworker", "services.simworker.config"),
    ("capacity registrar", "python -m services.capacity.registrar", "services.capacity.registrar"),
)


def settings_of(module: str) -> Sequence[Any]:
    return importlib.import_module(module).SETTINGS


def _default(setting: Any) -> str:
    value = setting.default
    if setting.repeated:
        return ", ".join(f"`{v}`" for v in value) if value else "none"
    if value is None:
        return "see meaning"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, str):
        return f"`{value}`" if value else "empty"
    return f"`{value}`"


def _flag(setting: Any) -> str:
    if setting.type is bool:
        name = setting.flag_name
        return f"`{name}` / `--no-{name[2:]}`"
    return f"`{setting.flag_name}`" + (" (repeatable)" if setting.repeated else "")


def _meaning(setting: Any) -> str:
    text = " ".join(setting.help.split())
    if setting.choices:
        text += f" (one of {', '.join(f'`{c}`' for c in setting.choices)})"
    return text.replace("|", "\\|")


def render() -> str:
    lines: list[str] = []
    for title, command, module in COMMANDS:
        settings = settings_of(module)
        lines += [
            f"### {title}",
            "",
            f"`{command}` — {len(settings)} settings.",
            "",
            "| flag | environment | default | meaning |",
            "|---|---|---|---|",
        ]
        for s in settings:
            env = f"`{s.env}`" if s.env else ""
            lines.append(f"| {_flag(s)} | {env} | {_default(s)} | {_meaning(s)} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return run(DOC, SECTION, render(), argv, "scripts/flags_table.py")


if __name__ == "__main__":
    raise SystemExit(main())
