"""`python -m services.simworker --port 0 --model-name m ...`: one simulated SGLang server, until SIGINT/SIGTERM.

Exit status 2 on invalid configuration (the message names the violated rule), 1 with one line when the
port is taken.
"""

from __future__ import annotations

import os
import sys

from services.common.serve.entrypoint import service_main
from services.simworker.config import load_config
from services.simworker.server import RunningSimWorker, start_simworker


async def _start(config, *, telemetry) -> RunningSimWorker:
    worker = await start_simworker(config, telemetry=telemetry)
    # The bound port on stdout, for people and for launchers that read it.
    print(f"simworker listening on {worker.url} port={worker.port} pid={os.getpid()}", flush=True)
    return worker


def main(argv: list[str] | None = None) -> int:
    return service_main("simworker", load_config, _start, lambda worker: worker, argv)


if __name__ == "__main__":
    sys.exit(main())
