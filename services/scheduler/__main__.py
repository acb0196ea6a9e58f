"""`python -m services.scheduler --capacity-addr HOST:PORT [flags]`: run the scheduler until SIGINT/SIGTERM.

Every flag and environment variable of `services/scheduler/config.py` (the seed reference's
control-loop settings, the KvRouter settings it forwards, listen/metrics/ready-file). Invalid
configuration prints the ConfigError, which names the violated rule, to stderr and exits 2.
"""

from __future__ import annotations

import os
import sys

from services.common.errors import ConfigError
from services.common.grpc_server import run, serve_until_signal
from services.common.logs import setup_logging
from services.common.telemetry import setup_telemetry
from services.scheduler.config import load_config
from services.scheduler.server import start_scheduler


def main(argv: list[str] | None = None) -> int:
    try:
        config = load_config(sys.argv[1:] if argv is None else argv, os.environ)
    except ConfigError as exc:
        print(f"scheduler: {exc}", file=sys.stderr)
        return 2

    async def serve() -> int:
        setup_logging(config.log_level)
        running = await start_scheduler(config, telemetry=setup_telemetry("bandmaster-scheduler"))
        await serve_until_signal(running.host)
        return 0

    return run(serve)


if __name__ == "__main__":
    sys.exit(main())
