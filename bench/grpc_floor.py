"""The gRPC floor of the scheduler benchmark: the Scheduler service answering Admit / AdmitStream / Complete
with empty messages, on the same stack as the service (grpc.aio on uvloop, no interceptors).

    python -m bench.grpc_floor --ready-file PATH

What one Admit+Complete costs this process is what gRPC framing and protobuf alone cost on this machine:
the scheduler's CPU per round trip minus this one is what the service adds (host interceptors, tracing,
the servicer, the decision, the durable write-through). Runs until SIGTERM / SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

import grpc

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from bandmaster.scheduler.v1 import scheduler_pb2_grpc as pb_grpc


class FloorServicer(pb_grpc.SchedulerServicer):
    async def Admit(self, request: pb.AdmitRequest, context: grpc.aio.ServicerContext) -> pb.AdmitResponse:
        return pb.AdmitResponse(worker_id="w0")

    async def AdmitStream(self, request: pb.AdmitRequest, context: grpc.aio.ServicerContext) -> None:
        await context.write(pb.AdmitUpdate(decision=pb.AdmitResponse(worker_id="w0")))

    async def Complete(self, request: pb.CompleteRequest, context: grpc.aio.ServicerContext) -> pb.CompleteResponse:
        return pb.CompleteResponse()

    async def GetStats(self, request: pb.GetStatsRequest, context: grpc.aio.ServicerContext) -> pb.Stats:
        return pb.Stats(replicas=[pb.ReplicaUtilization(worker_id="w0")])


async def serve(ready_file: Path) -> None:
    server = grpc.aio.server()
    pb_grpc.add_SchedulerServicer_to_server(FloorServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    ready_file.write_text(json.dumps({"grpc": f"127.0.0.1:{port}"}))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.grpc_floor", description=__doc__.splitlines()[0])
    parser.add_argument("--ready-file", required=True, type=Path)
    args = parser.parse_args(argv)
    import uvloop

    uvloop.run(serve(args.ready_file))
    return 0


if __name__ == "__main__":
    sys.exit(main())
