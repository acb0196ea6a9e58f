"""The `bandmaster` command: `up`, `clusters`, `status`, `programs`, `plan`, `batch`, `demo`, `bench`, `trace`."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from services.common.settings.errors import ConfigError

SIGPIPE_EXIT = 128 + 13
"""What a shell reports for a process a closed pipe ended (`bandmaster programs | head`)."""
SIGINT_EXIT = 128 + 2


def main(argv: Sequence[str] | None = None) -> int:
    """The command line, as Unix tools end: a reader that closed the pipe (`| head`) ends it quietly
    (SIGPIPE_EXIT), Ctrl-C at any moment, even while the commands are still being imported, is one line
    (SIGINT_EXIT), never a traceback."""
    try:
        try:
            return _main(argv)
        finally:
            sys.stdout.flush()  # here, not at interpreter exit, so that a closed pipe is caught below
    except BrokenPipeError:
        # Later writes, and the interpreter's own flush at exit, would fail again: send them nowhere.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return SIGPIPE_EXIT
    except KeyboardInterrupt:
        print("bandmaster: interrupted", file=sys.stderr)
        return SIGINT_EXIT


def _main(argv: Sequence[str] | None) -> int:
    from services.cli import clusters, demo, endpoints, plan, programs, status, trace, up
    from services.cli.help import CliParser

    parser = CliParser(prog="bandmaster", description="Program-aware scheduling for agentic LLM inference")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=CliParser)
    up.add_parser(commands)
    clusters.add_parser(commands)
    demo.add_parser(commands)
    programs.add_parser(commands)
    plan.add_parser(commands)
    status.add_parser(commands)
    trace.add_parser(commands)
    _add_bench(commands)
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except ConfigError as exc:
        print(f"bandmaster: {exc}", file=sys.stderr)
        return 2
    except endpoints.ClusterNotFound as exc:
        print(f"bandmaster {args.command}: {exc}", file=sys.stderr)
        return 2
    except endpoints.ServiceAbsent as exc:
        print(f"bandmaster {args.command}: {exc}", file=sys.stderr)
        return 1


def _add_bench(commands) -> None:
    from clients import player

    parser = commands.add_parser("bench", help="play agent programs against an OpenAI-compatible endpoint")
    player.add_arguments(parser)

    def run(args: argparse.Namespace) -> int:
        import asyncio

        return player.print_report(asyncio.run(player.run_from_args(args)))

    parser.set_defaults(run=run)


if __name__ == "__main__":
    sys.exit(main())
