"""A minimal gRPC service process for supervisor tests: `python -m tests.unit.cli.fake_service --ready-file F`."""

import argparse
import sys

from services.common.serve.grpc_server import ServiceHost, run, serve_until_signal


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ready-file", required=True)
    parser.add_argument("--fail", action="store_true", help="exit at once with an error")
    args = parser.parse_args()
    if args.fail:
        print("fake_service: refusing to start (as asked)", file=sys.stderr)
        return 3
    host = ServiceHost("fake", listen="127.0.0.1:0", metrics_port=-1, shutdown_grace_seconds=0.2)
    await host.start()
    host.write_ready_file(args.ready_file)
    await serve_until_signal(host)
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
