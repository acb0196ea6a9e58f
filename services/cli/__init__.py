"""The `bandmaster` command: `up`, `demo` (and, as services land, more)."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from services.common.errors import ConfigError


def main(argv: Sequence[str] | None = None) -> int:
    from services.cli import demo, up

    parser = argparse.ArgumentParser(prog="bandmaster", description="Program-aware scheduling for agentic LLM inference")
    commands = parser.add_subparsers(dest="command", required=True)
    up.add_parser(commands)
    demo.add_parser(commands)
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except ConfigError as exc:
        print(f"bandmaster: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
