"""docs/flags.md lists every service's settings exactly as its Setting table declares them."""

from __future__ import annotations

import dataclasses

import pytest

from scripts import flags_table
from scripts.doc_markers import splice
from services.common.settings.config import build_parser


def test_docs_flags_md_is_current():
    page = flags_table.DOC.read_text()
    assert page == splice(page, flags_table.SECTION, flags_table.render()), (
        "docs/flags.md is stale: run `python scripts/flags_table.py --write`"
    )


@pytest.mark.parametrize("title, command, module", flags_table.COMMANDS)
def test_every_flag_of_every_command_is_documented(title, command, module):
    page = flags_table.DOC.read_text()
    section = page.split(f"### {title}\n", 1)[1].split("\n### ", 1)[0]
    settings = flags_table.settings_of(module)
    parser = build_parser(command, "", settings)
    for action in parser._actions:  # what the command line really accepts
        for option in action.option_strings:
            if option not in ("-h", "--help"):
                assert f"`{option}`" in section, f"{command}: {option} is not in docs/flags.md"
    envs = [s.env for s in settings if s.env]
    assert len(set(envs)) == len(envs), f"{command}: two settings share an environment variable"


def test_a_changed_default_makes_the_page_stale(monkeypatch):
    from services.router import config

    page = flags_table.DOC.read_text()
    changed = [dataclasses.replace(s, default=12345) if s.name == "http_port" else s for s in config.SETTINGS]
    monkeypatch.setattr(config, "SETTINGS", changed)
    assert splice(page, flags_table.SECTION, flags_table.render()) != page


def test_modules_listed_are_every_service_entrypoint():
    titles = {title for title, _, _ in flags_table.COMMANDS}
    assert {"capacity", "scheduler", "router", "planner", "simworker"} <= titles
