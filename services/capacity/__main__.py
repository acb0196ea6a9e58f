"""`python -m services.capacity [flags]`: run the capacity service until SIGINT/SIGTERM.

Invalid configuration prints the ConfigError to stderr and exits 2.
"""

from __future__ import annotations

import os
import sys

from services.capacity.config import load_config
from services.capacity.server import start_capacity
from services.common.errors import ConfigError
from services.common.grpc_server import run, serve_until_signal
from services.common.logs import setup_logging
from services.common.telemetry import setup_telemetry


def main(argv: list[str] | None = None) -> int:
    try:
        config = load_config(sys.argv[1:] if argv is None else argv, os.environ)
    except ConfigError as exc:
        print(f"capacity: {exc}", file=sys.stderr)
        return 2

    async def serve() -> int:
        setup_logging(config.log_level)
        running = await start_capacity(config, telemetry=setup_telemetry("bandmaster-capacity"))
        await serve_until_signal(running.host)
        return 0

    return run(serve)


if __name__ == "__main__":
    sys.exit(main())
