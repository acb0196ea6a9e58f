"""`python -m services.simworker --port 0 --model-name m ...`: one simulated SGLang server.

Exit status 2 on invalid configuration (the message names the violated rule).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from services.common.errors import ConfigError
from services.common.logs import setup_logging
from services.common.telemetry import setup_telemetry
from services.common.ports import PortInUse
from services.simworker.config import load_config
from services.simworker.server import start_simworker


async def _serve(config) -> None:
    telemetry = setup_telemetry("bandmaster-simworker", sample_ratio=config.trace_sample_ratio)
    worker = await start_simworker(config, telemetry=telemetry)
    # The bound port on stdout, for people and for launchers that read it.
    print(f"simworker listening on {worker.url} port={worker.port} pid={os.getpid()}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await worker.stop()


def main(argv: list[str] | None = None) -> int:
    try:
        config = load_config(sys.argv[1:] if argv is None else argv, os.environ)
    except ConfigError as exc:
        print(f"simworker: {exc}", file=sys.stderr)
        return 2
    setup_logging(config.log_level)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(_serve(config))
    except ConfigError as exc:  # e.g. an unknown timing profile, found when the engine is built
        print(f"simworker: {exc}", file=sys.stderr)
        return 2
    except PortInUse as exc:
        print(f"simworker: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
