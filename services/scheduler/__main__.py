"""`python -m services.scheduler --capacity-addr HOST:PORT [flags]`: run the scheduler until SIGINT/SIGTERM.

Every flag and environment variable of `services/scheduler/config.py` (the seed reference's
control-loop settings, the KvRouter settings it forwards, listen/metrics/ready-file). Invalid
configuration prints the ConfigError, which names the violated rule, to stderr and exits 2.
"""

from __future__ import annotations

import sys

from services.common.serve.entrypoint import service_main
from services.scheduler.config import load_config
from services.scheduler.server import start_scheduler


def main(argv: list[str] | None = None) -> int:
    return service_main("scheduler", load_config, start_scheduler, lambda running: running.host, argv)


if __name__ == "__main__":
    sys.exit(main())
