"""`python -m services.batch [flags]`: run the batch service until SIGINT/SIGTERM.

Invalid configuration prints the ConfigError to stderr and exits 2.
"""

from __future__ import annotations

import sys

from services.batch.config import load_config
from services.batch.server import start_batch
from services.common.serve.entrypoint import service_main


def main(argv: list[str] | None = None) -> int:
    return service_main("batch", load_config, start_batch, lambda running: running.host, argv)


if __name__ == "__main__":
    sys.exit(main())
