"""docs/getting-started.md stays true: its port table is the defaults, every `bandmaster` command line in
it parses, and its Python examples compile (they are run against a live cluster by hand; see the page)."""

import argparse
import re
import shlex
from pathlib import Path

import pytest

from services import cli
from services.cli.up import PORT_FLAGS
from services.common.serve.ports import DEFAULT_PORTS

DOC = Path(__file__).resolve().parents[3] / "docs" / "getting-started.md"
TEXT = DOC.read_text()


def test_the_port_table_is_the_defaults_with_their_flags():
    rows = {}
    for line in TEXT.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 3 and cells[2].startswith("`--"):
            rows[cells[0]] = (cells[1], cells[2])
    assert rows["router, OpenAI / SGLang HTTP API"] == (str(DEFAULT_PORTS["router_http"]), "`--http-port`")
    for name, key in (
        ("capacity", "capacity"),
        ("scheduler", "scheduler"),
        ("planner", "planner"),
        ("batch service", "batch"),
    ):
        port, flag = next(v for k, v in rows.items() if k.startswith(name + " ("))
        assert (port, flag) == (str(DEFAULT_PORTS[key]), f"`{PORT_FLAGS[key]}`")
    port, flag = next(v for k, v in rows.items() if k.startswith("router, gRPC"))
    assert (port, flag) == (str(DEFAULT_PORTS["router"]), f"`{PORT_FLAGS['router']}`")
    assert rows["batch service's Batch API (also served through the router)"] == (
        str(DEFAULT_PORTS["batch_http"]),
        f"`{PORT_FLAGS['batch_http']}`",
    )
    metrics = rows["`/metrics` of capacity, scheduler, router, planner, batch service"][0]
    assert metrics == ", ".join(
        str(DEFAULT_PORTS[f"{s}_metrics"]) for s in ("capacity", "scheduler", "router", "planner", "batch")
    )


def _commands() -> list[list[str]]:
    found = []
    for line in TEXT.splitlines():
        command = line.split("#")[0].rstrip()
        match = re.search(r"(?:\.venv/bin/)?bandmaster ((?:up|status|programs|plan|bench)(?:\s[^`]*)?)$", command)
        if match and line.lstrip().startswith((".venv/bin/bandmaster", "bandmaster")):
            found.append(shlex.split(match.group(1)))
    return found


def test_every_command_line_on_the_page_parses(monkeypatch):
    commands = _commands()
    assert len(commands) >= 4
    parsed = []

    def keep(args):
        parsed.append(args)
        return 0

    for argv in commands:
        real = argparse.ArgumentParser.parse_args

        def parse_only(self, args=None, namespace=None, _real=real):
            ns = _real(self, args, namespace)
            ns.run = keep
            return ns

        monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_only)
        assert cli.main(argv) == 0, argv
        monkeypatch.undo()
    assert len(parsed) == len(commands)


@pytest.mark.parametrize("block", re.findall(r"```python\n(.*?)```", TEXT, re.S))
def test_the_python_examples_compile(block):
    source = block
    if "async with" in block and "async def" not in block:  # a fragment meant for an async function
        source = "async def _example():\n" + "\n".join("    " + line for line in block.splitlines())
    compile(source, str(DOC), "exec")
