"""`python -m services.router`: invalid configuration -> stderr naming the rule, exit 2."""

from __future__ import annotations

import os
import sys

from services.common.errors import ConfigError
from services.common.grpc_server import run, serve_until_signal
from services.common.logs import setup_logging
from services.router.config import load_config


async def _main() -> int:
    try:
        config = load_config(sys.argv[1:], os.environ)
    except ConfigError as exc:
        print(f"router: {exc}", file=sys.stderr)
        return 2
    setup_logging(config.log_level)
    from services.router.server import start_router

    running = await start_router(config)
    await serve_until_signal(running.host_)
    return 0


if __name__ == "__main__":
    sys.exit(run(_main))
