"""What a run measures of the local cluster and the machine under it: the fleet's health as the
capacity service sees it, the scheduler's pause counters, the simulated workers' lag behind their
clock and the cores' busy share, and whether the machine was too starved for the figures to mean
much. Shared by `bandmaster demo` and the live benchmarks (bench.compare, bench.soak)."""

from __future__ import annotations

import asyncio
import time

import grpc

from bandmaster.capacity.v1 import capacity_pb2, capacity_pb2_grpc

# Simulated workers that fall further behind their modelled clock than this share of the run's
# wall time were CPU-starved: the figures then measure the machine, not the scheduling.
STARVED_LATE_FRACTION = 0.10
# A machine whose cores were busier than this over a run had no CPU to spare: the router, the
# scheduler and the client queue for CPU even when the simulated workers keep their clock.
STARVED_CPU_BUSY = 0.90


def cpu_times() -> tuple[float, float] | None:
    """(busy, total) jiffies of all cores since boot, from /proc/stat (None where there is none)."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = [float(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_share(before: tuple[float, float] | None, after: tuple[float, float] | None) -> float | None:
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def wait_for_workers(address: str, expected: int, timeout_s: float = 30.0) -> capacity_pb2.WorkersSnapshot:
    """Poll ListWorkers until `expected` workers are HEALTHY (the capacity service polls them itself)."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(address) as channel:
        stub = capacity_pb2_grpc.CapacityStub(channel)
        while True:
            snapshot = stub.ListWorkers(capacity_pb2.ListWorkersRequest(), timeout=5)
            healthy = [w for w in snapshot.workers if w.health == capacity_pb2.WORKER_HEALTH_HEALTHY]
            if len(healthy) >= expected or time.monotonic() > deadline:
                return snapshot
            time.sleep(0.2)


async def worker_late_s(urls: list[str]) -> dict[str, float]:
    """Each simulated worker's accumulated lag behind its modelled clock (seconds of wall time);
    real SGLang servers report none and are left out."""
    import aiohttp

    out: dict[str, float] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        for url in urls:
            try:
                async with session.get(url.rstrip("/") + "/server_info") as response:
                    info = await response.json()
                late = info["internal_states"][0]["simworker_late_s_total"]
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError, IndexError, TypeError):
                continue
            out[url] = float(late)
    return out


def scheduler_counts(cluster) -> dict:
    if cluster.scheduler is None:
        return {}
    from bandmaster.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc

    with grpc.insecure_channel(cluster.scheduler.endpoint) as channel:
        stats = scheduler_pb2_grpc.SchedulerStub(channel).GetStats(scheduler_pb2.GetStatsRequest(), timeout=5)
    return {"pauses": stats.pauses_total, "resumes": stats.resumes_total, "forced_resumes": stats.forced_resumes_total}


def starved(summary: dict) -> bool:
    late, busy = summary.get("late_fraction"), summary.get("cpu_busy")
    return (late is not None and late > STARVED_LATE_FRACTION) or (busy is not None and busy > STARVED_CPU_BUSY)
