"""The one `python -m services.<name>` entry point shape every service shares.

Parse flags and environment with the service's `load_config`; on a `ConfigError` print it (it names
the violated rule) to stderr and exit 2 without starting anything; otherwise set up logging and
telemetry, start the service on uvloop and serve until SIGINT/SIGTERM, then shut down gracefully.
A `ConfigError` raised while starting (a file a flag names cannot be loaded) also exits 2; a port that
is already taken is one line naming it and the flag that moves it (exit 1), not a traceback.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Awaitable, Callable, Mapping, Sequence

from services.common.observe.logs import setup_logging
from services.common.observe.telemetry import setup_telemetry
from services.common.serve.grpc_server import Stoppable, run, serve_until_signal
from services.common.serve.ports import PortInUse
from services.common.settings.errors import ConfigError


def service_main(
    name: str,
    load_config: Callable[[Sequence[str], Mapping[str, str]], Any],
    start: Callable[..., Awaitable[Any]],
    host_of: Callable[[Any], Stoppable],
    argv: Sequence[str] | None = None,
) -> int:
    """Run service `name`: `start(config, telemetry=...)` returns a running object whose
    `host_of(running)` is what a signal stops (its ServiceHost, or the running object itself)."""
    try:
        config = load_config(sys.argv[1:] if argv is None else argv, os.environ)
    except ConfigError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2

    async def serve() -> int:
        setup_logging(config.log_level)
        try:
            running = await start(
                config,
                telemetry=setup_telemetry(
                    f"bandmaster-{name}", sample_ratio=config.trace_sample_ratio, export=config.tracing
                ),
            )
        except ConfigError as exc:  # found while starting, e.g. a file named by a flag
            print(f"{name}: {exc}", file=sys.stderr)
            return 2
        except PortInUse as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            return 1
        await serve_until_signal(host_of(running))
        return 0

    return run(serve)
