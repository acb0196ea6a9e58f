"""A scheduler client the cancel-storm test SIGKILLs: one Admit of a program, then `--calls` more behind
it (half unary Admit, half AdmitStream), then it waits to be killed (at most `--live-seconds`).

python -m tests.faults.admit_storm_client --address HOST:PORT --session-id b --calls 5000 --tag k
"""

from __future__ import annotations

import argparse
import asyncio

import grpc

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from bandmaster.scheduler.v1 import scheduler_pb2_grpc as pb_grpc


async def _drain(call) -> None:
    try:
        if isinstance(call, grpc.aio.UnaryStreamCall):
            async for _ in call:
                pass
        else:
            await call
    except (grpc.aio.AioRpcError, asyncio.CancelledError):
        pass


async def main(args: argparse.Namespace) -> None:
    async with grpc.aio.insecure_channel(args.address) as channel:
        stub = pb_grpc.SchedulerStub(channel)

        def admit(request_id: str, stream: bool):
            request = pb.AdmitRequest(session_id=args.session_id, request_id=request_id, estimated_prompt_tokens=50)
            return (stub.AdmitStream if stream else stub.Admit)(request, timeout=args.live_seconds)

        calls = [admit(f"{args.tag}-held", False)]
        await asyncio.sleep(0.5)  # the first one is held before the others queue behind it
        calls += [admit(f"{args.tag}-{i}", i % 2 == 1) for i in range(args.calls)]
        tasks = [asyncio.ensure_future(_drain(call)) for call in calls]
        print("sent", flush=True)
        await asyncio.wait(tasks, timeout=args.live_seconds)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--session-id", required=True)
    parser.add_argument("--calls", type=int, required=True)
    parser.add_argument("--tag", required=True)
    parser.add_argument("--live-seconds", type=float, default=60.0)
    asyncio.run(main(parser.parse_args()))
