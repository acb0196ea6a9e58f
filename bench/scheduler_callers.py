"""Load generator of the scheduler benchmark: callers looping Admit -> Complete, in a process of their own.

    python -m bench.scheduler_callers --addr HOST:PORT --first 0 --count 250 --channels 2 [--sessions N] [--once]

The benchmark starts one or more of these so that the callers' CPU is not the scheduler's: on a small
machine the load generator in the scheduler bench's own process was the bottleneck it measured. The
process connects, prints `ready`, then reads one line `GO <warmup_until> <stop_at>` (wall-clock seconds)
from stdin: it loops until `stop_at`, recording the latencies of the round trips that start after
`warmup_until`, and prints one JSON line of results.

Caller `i` (of `first .. first+count-1`) uses session `bench-<i>` for every turn, or, with `--sessions N`,
walks the sessions `i, i + callers, ...` modulo N (N programs in the table); `--once` walks its share of
the N sessions once and ends (the benchmark's memory phase: load N programs).

`--mux`: the process opens one AdmitMux stream (the router's multiplexed path) and every caller's Admit and
Complete go through it as operations; what the callers have ready in one event-loop turn goes in one message.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import grpc

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from bandmaster.scheduler.v1 import scheduler_pb2_grpc as pb_grpc


class MuxCaller:
    """One AdmitMux stream shared by the process's callers: `admit`/`complete` queue an operation and wait
    for its last result; a writer sends what was queued in one event-loop turn as one MuxRequest."""

    def __init__(self, client: pb_grpc.SchedulerStub) -> None:
        self.call = client.AdmitMux()
        self.queued: list[pb.MuxOp] = []
        self.waiting: dict[int, asyncio.Future] = {}
        self.next_id = 0
        self.wake = asyncio.Event()
        self.tasks = [asyncio.ensure_future(self._write()), asyncio.ensure_future(self._read())]

    async def _write(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            ops, self.queued = self.queued, []
            await self.call.write(pb.MuxRequest(ops=ops))

    async def _read(self) -> None:
        try:
            async for response in self.call:
                for result in response.results:
                    kind = result.WhichOneof("result")
                    if kind == "admit" and not result.admit.HasField("decision"):
                        continue  # held: the decision follows
                    waiter = self.waiting.pop(result.id, None)
                    if waiter is not None and not waiter.done():
                        waiter.set_result(result)
        finally:
            for waiter in self.waiting.values():
                if not waiter.done():
                    waiter.set_exception(ConnectionError("the AdmitMux stream ended"))

    async def _op(self, op: pb.MuxOp) -> pb.MuxResult:
        self.next_id += 1
        op.id = self.next_id
        waiter = asyncio.get_running_loop().create_future()
        self.waiting[op.id] = waiter
        self.queued.append(op)
        self.wake.set()
        async with asyncio.timeout(30):
            result = await waiter
        if result.WhichOneof("result") == "error":
            raise ConnectionError(f"{result.error.code}: {result.error.message}")
        return result

    async def admit(self, request: pb.AdmitRequest) -> pb.AdmitResponse:
        return (await self._op(pb.MuxOp(admit=pb.MuxAdmit(request=request, timeout_seconds=30)))).admit.decision

    async def complete(self, request: pb.CompleteRequest) -> None:
        await self._op(pb.MuxOp(complete=pb.MuxComplete(request=request)))

    async def close(self) -> None:
        await self.call.done_writing()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def run(args: argparse.Namespace) -> dict:
    chans = [
        grpc.aio.insecure_channel(args.addr, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(args.channels)
    ]
    clients = [pb_grpc.SchedulerStub(c) for c in chans]
    for c in chans:
        await asyncio.wait_for(c.channel_ready(), 30)
    mux = MuxCaller(clients[0]) if args.mux else None
    print("ready", flush=True)
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    _, warmup_until_s, stop_at_s = line.split()
    warmup_until, stop_at = float(warmup_until_s), float(stop_at_s)
    latencies_ms: list[float] = []
    held = errors = 0
    total_callers = args.total_callers or args.count

    async def caller(i: int) -> None:
        nonlocal held, errors
        client = clients[i % len(clients)]
        turn = 0
        walk = range(i, args.sessions, total_callers) if args.sessions else range(i, i + 1)
        if not walk:
            return
        while time.time() < stop_at:
            if args.once and turn >= len(walk):
                return
            sid = f"bench-{walk[turn % len(walk)]}"
            turn += 1
            rid = f"{sid}-{i}-{turn}"
            started = time.perf_counter()
            measured = time.time() >= warmup_until
            try:
                request = pb.AdmitRequest(session_id=sid, request_id=rid, estimated_prompt_tokens=2_000)
                if mux is not None:
                    resp = await mux.admit(request)
                elif args.stream:
                    # The router's path: AdmitStream, read up to the decision (a held program sends `held`
                    # first), then the call ends.
                    call = client.AdmitStream(request, timeout=30)
                    async for update in call:
                        if update.HasField("decision"):
                            resp = update.decision
                            break
                    else:
                        errors += 1
                        continue
                else:
                    resp = await client.Admit(request, timeout=30)
                done = pb.CompleteRequest(
                    session_id=sid,
                    request_id=rid,
                    worker_id=resp.worker_id,
                    dp_rank=resp.dp_rank,
                    prompt_tokens=2_000,
                    completion_tokens=200,
                )
                if mux is not None:
                    await mux.complete(done)
                else:
                    await client.Complete(done, timeout=30)
            except (grpc.aio.AioRpcError, ConnectionError, TimeoutError):
                errors += 1
                continue
            if measured:
                latencies_ms.append((time.perf_counter() - started) * 1e3)
                held += resp.was_paused

    await asyncio.gather(*(caller(i) for i in range(args.first, args.first + args.count)))
    if mux is not None:
        await mux.close()
    for c in chans:
        await c.close()
    return {"latencies_ms": [round(x, 3) for x in latencies_ms], "held": held, "errors": errors}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scheduler_callers", description=__doc__.splitlines()[0])
    parser.add_argument("--addr", required=True)
    parser.add_argument("--result-file", required=True, help="where the JSON result is written")
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--total-callers", type=int, default=0, help="callers over all processes (for --sessions)")
    parser.add_argument("--channels", type=int, default=2)
    parser.add_argument("--sessions", type=int, default=0, help="walk N sessions instead of one per caller")
    parser.add_argument("--stream", action="store_true", help="AdmitStream (the router's call) instead of Admit")
    parser.add_argument("--mux", action="store_true", help="one AdmitMux stream for all the process's callers")
    parser.add_argument("--once", action="store_true", help="walk this process's share of --sessions once")
    args = parser.parse_args(argv)
    try:
        import uvloop

        result = uvloop.run(run(args))
    except ImportError:
        result = asyncio.run(run(args))
    # To a file: a large result written to the stdout pipe can be cut short (the event loop may leave the
    # pipe non-blocking).
    with open(args.result_file, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
