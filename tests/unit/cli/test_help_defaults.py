"""`--help` of every command shows each option's default: every `bandmaster` subcommand and every
`python -m services.X`."""

import argparse

import pytest

from services import cli
from services.batch.config import SETTINGS as BATCH
from services.capacity.config import SETTINGS as CAPACITY
from services.capacity.registrar import SETTINGS as REGISTRAR
from services.common.settings.config import build_parser
from services.planner.config import SETTINGS as PLANNER
from services.router.config import SETTINGS as ROUTER
from services.scheduler.config import SETTINGS as SCHEDULER
from services.simworker.config import SETTINGS as SIMWORKER

_FLAGS = (argparse._HelpAction, argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._SubParsersAction)


def _root_parser(monkeypatch) -> argparse.ArgumentParser:
    captured = {}

    def grab(self, *args, **kwargs):
        captured["parser"] = self
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", grab)
    with pytest.raises(SystemExit):
        cli.main([])
    return captured["parser"]


def _walk(parser: argparse.ArgumentParser, name: str):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _walk(sub, f"{name} {sub_name}")


def _missing(parser: argparse.ArgumentParser) -> list[str]:
    """Options that take a value and whose help line names no default."""
    formatter = parser._get_formatter()
    missing = []
    for action in parser._actions:
        if not action.option_strings or isinstance(action, _FLAGS) or action.nargs == 0:
            continue
        text = formatter._get_help_string(action) if action.help else ""
        if "default" not in text.lower():
            missing.append("/".join(action.option_strings))
    return missing


def test_every_bandmaster_command_shows_its_defaults(monkeypatch):
    commands = dict(_walk(_root_parser(monkeypatch), "bandmaster"))
    assert {
        "bandmaster up",
        "bandmaster status",
        "bandmaster programs",
        "bandmaster plan",
        "bandmaster batch",
        "bandmaster demo",
        "bandmaster bench",
    } <= set(commands)
    assert {name: _missing(p) for name, p in commands.items() if _missing(p)} == {}
    up_help = commands["bandmaster up"].format_help()
    assert "(default: 50051; 0 = any free port)" in up_help and "(default: fixed)" in up_help


@pytest.mark.parametrize(
    "name, settings",
    [
        ("capacity", CAPACITY),
        ("scheduler", SCHEDULER),
        ("router", ROUTER),
        ("planner", PLANNER),
        ("batch", BATCH),
        ("simworker", SIMWORKER),
        ("capacity.registrar", REGISTRAR),
    ],
)
def test_every_service_shows_its_defaults(name, settings):
    parser = build_parser(name, "", settings)
    assert _missing(parser) == []
