"""`python -m services.capacity [flags]`: run the capacity service until SIGINT/SIGTERM.

Invalid configuration prints the ConfigError to stderr and exits 2.
"""

from __future__ import annotations

import sys

from services.capacity.config import load_config
from services.capacity.server import start_capacity
from services.common.serve.entrypoint import service_main


def main(argv: list[str] | None = None) -> int:
    return service_main("capacity", load_config, start_capacity, lambda running: running.host, argv)


if __name__ == "__main__":
    sys.exit(main())
