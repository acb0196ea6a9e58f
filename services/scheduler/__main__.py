"""`python -m services.scheduler --capacity-addr HOST:PORT [flags]`: run the scheduler until SIGINT/SIGTERM.

Every flag and environment variable of `services/scheduler/config.py` (the seed reference's
control-loop settings, the KvRouter settings it forwards, listen/metrics/ready-file). Invalid
configuration prints the ConfigError, which names the violated rule, to stderr and exits 2.
"""

from __future__ import annotations

import sys
from typing import Any

from services.common.process.heap import settle_heap
from services.common.serve.entrypoint import service_main
from services.scheduler.config import SchedulerConfig, load_config
from services.scheduler.server import RunningScheduler, start_scheduler


async def start_and_settle(config: SchedulerConfig, **kwargs: Any) -> RunningScheduler:
    """Start the service (the table is restored before it returns), then settle the process's heap:
    a process concern, so here and not in `start_scheduler`, which tests run many times in one process."""
    running = await start_scheduler(config, **kwargs)
    settle_heap(len(running.runtime.core.ledger.programs) if running.runtime is not None else 0)
    return running


def main(argv: list[str] | None = None) -> int:
    return service_main("scheduler", load_config, start_and_settle, lambda running: running.host, argv)


if __name__ == "__main__":
    sys.exit(main())
