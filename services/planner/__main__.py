"""`python -m services.planner [flags]`: run the planner until SIGINT/SIGTERM.

Invalid configuration (or a lease store unreachable at start-up) prints the ConfigError to
stderr and exits 2.
"""

from __future__ import annotations

import sys

from services.common.serve.entrypoint import service_main
from services.planner.config import load_config
from services.planner.server import start_planner


def main(argv: list[str] | None = None) -> int:
    return service_main("planner", load_config, start_planner, lambda running: running.host, argv)


if __name__ == "__main__":
    sys.exit(main())
