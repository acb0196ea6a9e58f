"""`python -m services.router [flags]`: run the router until SIGINT/SIGTERM.

Invalid configuration prints the ConfigError, which names the violated rule, to stderr and exits 2.
With `--processes N` (N > 1) this process starts N routers on the same ports and supervises them
(services/router/processes.py).
"""

from __future__ import annotations

import os
import sys

from services.common.process.heap import settle_heap
from services.common.serve.entrypoint import service_main
from services.common.settings.errors import ConfigError
from services.router.config import load_config


async def _start(config, *, telemetry):
    """Start the router, then settle the process's heap (services/common/process/heap.py): a process
    concern, so here and not in `start_router`, which tests run many times in one process."""
    from services.router.server import start_router  # the data plane's imports are heavy; config errors are not

    running = await start_router(config, telemetry=telemetry)
    settle_heap()
    return running


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        config = load_config(args, os.environ)
    except ConfigError:
        config = None  # service_main prints it and exits 2
    if config is not None and config.processes > 1:
        from services.router.processes import run_processes

        return run_processes(config, args)
    return service_main("router", load_config, _start, lambda running: running.host_, args)


if __name__ == "__main__":
    sys.exit(main())
