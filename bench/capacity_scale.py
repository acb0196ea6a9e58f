"""Capacity service at scale: recompute cost and WatchWorkers fan-out.

    python -m bench.capacity_scale --out bench/results/capacity_scale.json [--smoke]

1. recompute: `recompute(settings, workers)` (and the protobuf snapshot built from it) over
   1,000 workers with mixed cards: plain, HiCache by ratio and by reported host tokens, write
   policies, DP (with and without DP attention), rejected cards, unhealthy and pending workers.
2. fan-out: `python -m services.capacity` as a subprocess with 1,000 workers registered over
   gRPC (all served by one sglang_stub under distinct path prefixes), 20 real gRPC watchers each
   on its own channel; each change is a Heartbeat with a new load; we time from sending it to the
   moment the last of the 20 watchers has received the new version.
3. router-load fan-out (router replica sync): on the same service, 16 routers' load reports (each on
   `workers // 10` replicas) and 16 `WatchRouterLoads` watchers; each change is one router's
   `ReportRouterLoad`; we time from sending it to the moment the last watcher has the new table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import grpc

from bandmaster.capacity.v1 import capacity_pb2 as pb
from bandmaster.capacity.v1 import capacity_pb2_grpc as pb_grpc
from bench.machine import machine
from clients.stats import percentile
from services.capacity.adapters.proto import snapshot_to_proto
from services.capacity.core.cards import RetentionSettings, derive_card, recompute
from services.capacity.core.state import Health, Origin, PollFailureReason, WorkerState
from services.common.process import orphan_guard
from services.common.process.child_stop import stop_child_async
from services.common.process.ready import wait_ready_file_async
from tests.support.sglang_stub import SglangStub, sglang_info

ROOT = Path(__file__).resolve().parents[1]


def mixed_info(i: int) -> object:
    kind = i % 10
    base = sglang_info(max_total_num_tokens=100_000 + 37 * i, page_size=16)
    if kind == 1:
        base.update(enable_hierarchical_cache=True, hicache_ratio=2.0, hicache_write_policy="write_back")
    elif kind == 2:
        base.update(
            enable_hierarchical_cache=True,
            hicache_ratio=4.0,
            hicache_write_policy="write_through",
            hicache_storage_backend="mooncake",
        )
    elif kind == 3:
        base.update(
            enable_hierarchical_cache=True, hicache_host_total_tokens=300_000, hicache_write_policy="write_back"
        )
    elif kind == 4:
        base.update(dp_size=4, enable_dp_attention=True, max_running_requests=512)
    elif kind == 5:
        base.update(dp_size=2)
    elif kind == 6:
        base.update(max_total_num_tokens="abc")  # rejected
    elif kind == 7:
        base.update(enable_hierarchical_cache=True, hicache_write_policy="write_through_selective")
    elif kind == 8:
        base.update(max_total_num_tokens=2**41)  # rejected: absurd
    return base


def mixed_workers(n: int) -> list[WorkerState]:
    out = []
    for i in range(n):
        result = derive_card(mixed_info(i))
        state = WorkerState(
            worker_id=f"w{i:05d}",
            url=f"http://10.0.{i // 250}.{i % 250}:30000",
            origin=Origin.RPC,
            registered_at=0.0,
            last_success_wall=1.7e9,
        )
        if hasattr(result, "gpu_kv_tokens"):
            state = replace(state, card=result, health=Health.HEALTHY)
        else:
            state = replace(state, rejection=result, health=Health.UNHEALTHY)
        if i % 50 == 49:
            state = replace(state, health=Health.UNHEALTHY, last_failure=PollFailureReason.TIMEOUT)
        if i % 97 == 96:
            state = replace(state, health=Health.PENDING, card=None)
        out.append(state)
    return out


def bench_recompute(workers: int, repeats: int) -> dict:
    states = mixed_workers(workers)
    settings = RetentionSettings()
    recompute_ms, snapshot_ms = [], []
    view = recompute(settings, states)
    for _ in range(repeats):
        t0 = time.perf_counter()
        view = recompute(settings, states)
        t1 = time.perf_counter()
        snap = snapshot_to_proto(view, 1, time.time())
        t2 = time.perf_counter()
        recompute_ms.append((t1 - t0) * 1e3)
        snapshot_ms.append((t2 - t1) * 1e3)
    return {
        "workers": workers,
        "repeats": repeats,
        "replicas": view.replica_count,
        "excluded_workers": sum(1 for w in view.workers if w.excluded_reason),
        "recompute_ms": {"p50": percentile(recompute_ms, 50), "p99": percentile(recompute_ms, 99)},
        "snapshot_build_ms": {"p50": percentile(snapshot_ms, 50), "p99": percentile(snapshot_ms, 99)},
        "snapshot_bytes": snap.ByteSize(),
    }


class Watcher:
    def __init__(self, address: str) -> None:
        self.channel = grpc.aio.insecure_channel(address, options=[("grpc.max_receive_message_length", 64 << 20)])
        self.version = 0
        self.size = 0
        self.changed = asyncio.Event()
        self.task: asyncio.Task | None = None

    async def run(self) -> None:
        stream = pb_grpc.CapacityStub(self.channel).WatchWorkers(pb.WatchWorkersRequest())
        async for snap in stream:
            if not snap.heartbeat:
                self.version = snap.version
                self.size = snap.ByteSize()
                self.changed.set()

    async def wait_for(self, version: int) -> float:
        while self.version < version:
            self.changed.clear()
            await self.changed.wait()
        return time.perf_counter()


class RouterLoadWatcher(Watcher):
    async def run(self) -> None:
        stream = pb_grpc.CapacityStub(self.channel).WatchRouterLoads(pb.WatchRouterLoadsRequest())
        async for table in stream:
            self.version = table.version
            self.size = table.ByteSize()
            self.changed.set()


def router_report(router: int, sequence: int, replicas: int) -> pb.RouterLoadReport:
    return pb.RouterLoadReport(
        router_id=f"router-{router:02d}",
        sequence=sequence,
        ttl_ms=60_000,
        loads=[
            pb.ReplicaActiveLoad(
                worker_id=f"w{i:05d}", active_requests=sequence % 7, prefill_tokens=100 * i, decode_blocks=i
            )
            for i in range(replicas)
        ],
    )


async def bench_router_load_fanout(
    client: pb_grpc.CapacityStub, address: str, routers: int, watchers: int, replicas: int, changes: int
) -> dict:
    ws = [RouterLoadWatcher(address) for _ in range(watchers)]
    try:
        for w in ws:
            w.task = asyncio.create_task(w.run())
        sequences = [0] * routers
        for r in range(routers):
            sequences[r] += 1
            await client.ReportRouterLoad(router_report(r, sequences[r], replicas))
        await asyncio.wait_for(asyncio.gather(*(w.wait_for(routers) for w in ws)), 60)
        version = max(w.version for w in ws)
        latencies_ms = []
        for i in range(changes):
            r = i % routers
            sequences[r] += 1
            target = version + 1
            start = time.perf_counter()
            await client.ReportRouterLoad(router_report(r, sequences[r], replicas))
            done = await asyncio.wait_for(asyncio.gather(*(w.wait_for(target) for w in ws)), 60)
            latencies_ms.append((max(done) - start) * 1e3)
            version = target
        return {
            "routers": routers,
            "watchers": watchers,
            "replicas_per_report": replicas,
            "changes": changes,
            "report_to_all_watchers_ms": {
                "p50": percentile(latencies_ms, 50),
                "p99": percentile(latencies_ms, 99),
                "mean": statistics.fmean(latencies_ms),
            },
            "table_bytes": ws[0].size,
        }
    finally:
        for w in ws:
            if w.task is not None:
                w.task.cancel()
            await w.channel.close()


async def bench_fanout(workers: int, watchers: int, changes: int, router_watchers: int = 16) -> tuple[dict, dict]:
    stub = SglangStub(sglang_info(max_total_num_tokens=200_000, page_size=16))
    await stub.start()
    tmp = tempfile.mkdtemp(prefix="capbench")
    ready = Path(tmp) / "ready.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BANDMASTER_CAPACITY_")}
    env["PYTHONPATH"] = str(ROOT)
    env["BANDMASTER_LOG_LEVEL"] = "WARNING"
    proc = await asyncio.create_subprocess_exec(
        *orphan_guard.command(
            sys.executable,
            "services.capacity",
            [
                "--listen",
                "127.0.0.1:0",
                "--metrics-port",
                "-1",
                "--ready-file",
                str(ready),
                "--poll-interval-seconds",
                "600",
                "--poll-timeout-seconds",
                "5",
                "--watch-heartbeat-seconds",
                "600",
            ],
        ),
        cwd=ROOT,
        env=env,
    )
    ws: list[Watcher] = []
    try:
        published = await wait_ready_file_async(ready, 30)
        if published is None:
            raise TimeoutError(f"{ready} did not appear")
        address = published["grpc"]
        async with grpc.aio.insecure_channel(address) as channel:
            client = pb_grpc.CapacityStub(channel)
            t0 = time.perf_counter()
            for start in range(0, workers, 100):
                await asyncio.gather(
                    *(
                        client.RegisterWorker(pb.RegisterWorkerRequest(url=f"{stub.url}/w{i}", worker_id=f"w{i:05d}"))
                        for i in range(start, min(start + 100, workers))
                    )
                )
            register_s = time.perf_counter() - t0

            async def all_healthy() -> pb.WorkersSnapshot:
                while True:
                    snap = await client.ListWorkers(pb.ListWorkersRequest())
                    if sum(w.health == pb.WORKER_HEALTH_HEALTHY for w in snap.workers) == workers:
                        return snap
                    await asyncio.sleep(0.2)

            snap = await asyncio.wait_for(all_healthy(), 120)
            settle_s = time.perf_counter() - t0
            ws = [Watcher(address) for _ in range(watchers)]
            for w in ws:
                w.task = asyncio.create_task(w.run())
            await asyncio.wait_for(asyncio.gather(*(w.wait_for(snap.version) for w in ws)), 60)
            latencies_ms = []
            version = max(w.version for w in ws)
            for i in range(changes):
                target = version + 1
                start = time.perf_counter()
                await client.Heartbeat(
                    pb.HeartbeatRequest(worker_id=f"w{i % workers:05d}", load=pb.WorkerLoad(num_running_reqs=i + 1))
                )
                done = await asyncio.wait_for(asyncio.gather(*(w.wait_for(target) for w in ws)), 60)
                latencies_ms.append((max(done) - start) * 1e3)
                version = target
            # The worker watchers stay open: the router-load fan-out runs beside them.
            router_loads = await bench_router_load_fanout(
                client, address, 16, router_watchers, max(workers // 10, 1), changes
            )
            return {
                "workers": workers,
                "watchers": watchers,
                "changes": changes,
                "register_s": register_s,
                "all_healthy_s": settle_s,
                "change_to_all_watchers_ms": {
                    "p50": percentile(latencies_ms, 50),
                    "p99": percentile(latencies_ms, 99),
                    "mean": statistics.fmean(latencies_ms),
                },
                "snapshot_bytes": ws[0].size,
            }, router_loads
    finally:
        for w in ws:
            if w.task is not None:
                w.task.cancel()
            await w.channel.close()
        await stop_child_async(proc, 20.0, name="capacity")
        await stub.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.capacity_scale", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/capacity_scale.json")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--watchers", type=int, default=None)
    args = parser.parse_args(argv)
    workers = args.workers or (50 if args.smoke else 1000)
    watchers = args.watchers or (3 if args.smoke else 20)
    report = {
        "benchmark": "capacity_scale",
        "smoke": args.smoke,
        "machine": machine(),
        "recompute": bench_recompute(workers, 20 if args.smoke else 200),
    }
    report["fanout"], report["router_load_fanout"] = asyncio.run(
        bench_fanout(workers, watchers, 5 if args.smoke else 50, 3 if args.smoke else 16)
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    r, f = report["recompute"], report["fanout"]
    print(f"{'measure':44} {'p50':>10} {'p99':>10}")
    print(
        f"{'recompute ms (' + str(r['workers']) + ' mixed workers)':44} {r['recompute_ms']['p50']:10.2f} "
        f"{r['recompute_ms']['p99']:10.2f}"
    )
    print(f"{'snapshot build ms':44} {r['snapshot_build_ms']['p50']:10.2f} {r['snapshot_build_ms']['p99']:10.2f}")
    print(
        f"{'change -> all ' + str(f['watchers']) + ' watchers ms (' + str(f['workers']) + ' workers)':44} "
        f"{f['change_to_all_watchers_ms']['p50']:10.2f} {f['change_to_all_watchers_ms']['p99']:10.2f}"
    )
    rl = report["router_load_fanout"]
    print(
        f"{'router report -> all ' + str(rl['watchers']) + ' watchers ms (' + str(rl['routers']) + ' routers)':44} "
        f"{rl['report_to_all_watchers_ms']['p50']:10.2f} {rl['report_to_all_watchers_ms']['p99']:10.2f}"
    )
    print(f"snapshot size: {f['snapshot_bytes']} bytes; router-load table {rl['table_bytes']} bytes")
    print(f"report written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
