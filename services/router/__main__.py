"""`python -m services.router [flags]`: run the router until SIGINT/SIGTERM.

Invalid configuration prints the ConfigError, which names the violated rule, to stderr and exits 2.
"""

from __future__ import annotations

import sys

from services.common.entrypoint import service_main
from services.router.config import load_config


def _start(config, *, telemetry):
    from services.router.server import start_router  # the data plane's imports are heavy; config errors are not

    return start_router(config, telemetry=telemetry)


def main(argv: list[str] | None = None) -> int:
    return service_main("router", load_config, _start, lambda running: running.host_, argv)


if __name__ == "__main__":
    sys.exit(main())
