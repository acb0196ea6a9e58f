"""Two schedulers, active and standby, on one store (a shared SQLite file, or Redis), under an agent load
through a router given both addresses. The active one is SIGKILLed, or SIGSTOPped (and continued once
deposed): the standby takes over from the durable table within the failover bound, the router follows
without a restart and without failing a turn open, no program and no turn is lost (the scheduler's turns
equal the client's, per program), and a deposed leader that wakes up writes nothing.

The measured times are printed (`-s` shows them): `failover` = the fault until the standby decides;
`router` = the fault until the first turn started after it is answered."""

from __future__ import annotations

import asyncio
import signal
import time
from dataclasses import dataclass, field

import aiohttp
import grpc
import pytest

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from bandmaster.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from services.scheduler.adapters.state_store import RedisStateStore, SqliteStateStore, decode_state
from tests.faults.support import start_scheduler
from tests.support import router_stack as stack
from tests.support.eventually import assert_eventually
from tests.support.router_doubles import MODEL

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
PROGRAMS = 8
FAILOVER_BOUND_S = 5.0


@dataclass
class Load:
    """PROGRAMS agent programs, each turn after turn (a short tool pause between) until stopped."""

    url: str
    turns: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    spans: list[tuple[float, float]] = field(default_factory=list)  # (started, answered), monotonic
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def program(self, session: aiohttp.ClientSession, sid: str) -> None:
        history = [{"role": "user", "content": f"task of {sid}: fix the failing test"}]
        while not self.stop.is_set():
            started = time.monotonic()
            async with session.post(
                self.url + "/v1/chat/completions",
                json={"model": MODEL, "max_tokens": 4, "messages": history},
                headers={"X-Dynamo-Session-ID": sid},
            ) as response:
                body = await response.json()
            if response.status != 200:
                self.errors.append(f"{sid}: {response.status} {body}")
                return
            self.turns[sid] = self.turns.get(sid, 0) + 1
            self.spans.append((started, time.monotonic()))
            history += [
                {"role": "assistant", "content": body["choices"][0]["message"]["content"] or "ok"},
                {"role": "user", "content": f"tool output {self.turns[sid]}"},
            ]
            await asyncio.sleep(0.05)

    async def run(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            await asyncio.gather(*(self.program(session, f"agent-{i}") for i in range(PROGRAMS)))


async def _role(address: str) -> str:
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            view = await pb_grpc.SchedulerStub(channel).GetLeadership(pb.GetLeadershipRequest(), timeout=0.5)
        except grpc.aio.AioRpcError:
            return "down"
        return view.role


async def _programs(address: str) -> dict[str, int]:
    async with grpc.aio.insecure_channel(address) as channel:
        listing = await pb_grpc.SchedulerStub(channel).ListPrograms(pb.ListProgramsRequest(), timeout=5)
    return {p.session_id: p.turns for p in listing.programs}


async def _stored(store_args: list[str]) -> dict[str, int]:
    """The program table as the store holds it (turns per program)."""
    if store_args[0] == "--state-redis-url":
        store = RedisStateStore(store_args[1], "bandmaster:scheduler:", 2.0)
    else:
        store = SqliteStateStore(store_args[1], shared=True)
    await store.open()
    try:
        stored = await store.load()
    finally:
        await store.close()
    return {r.session_id: r.turns for r in decode_state(stored, 0.0).state.programs}


async def _failover(tmp_path, store_args: list[str], fault: signal.Signals) -> None:
    st = stack.Stack(tmp_path)
    schedulers = []
    try:
        worker = st.add(await stack.simworker(tmp_path, "w"))
        cap = st.add(await stack.capacity(tmp_path, [worker.ready["url"]]))
        flags = ["--leader-election", *store_args, "--pause-policy", "threshold"]
        for name in ("scheduler-a", "scheduler-b"):
            schedulers.append(st.add(await start_scheduler(tmp_path, cap.ready["grpc"], *flags, name=name)))
        addresses = [s.ready["grpc"] for s in schedulers]
        # The router's defaults (a 2 s decision deadline, a 5 s failover search): what a deployment runs.
        router = st.add(await stack.router(tmp_path, cap.ready["grpc"], scheduler_addr=",".join(addresses)))
        url = stack.router_url(router)
        await stack.healthy_workers(url, 1)
        roles = {a: await _role(a) for a in addresses}
        assert sorted(roles.values()) == ["leader", "standby"], roles
        leader = next(s for s in schedulers if roles[s.ready["grpc"]] == "leader")
        standby = next(s for s in schedulers if s is not leader)

        load = Load(url)
        running = asyncio.create_task(load.run())
        await asyncio.sleep(2.0)
        assert not load.errors and sum(load.turns.values()) > PROGRAMS
        faulted_at = time.monotonic()
        if fault is signal.SIGKILL:
            leader.kill()
        else:
            leader.send_signal(signal.SIGSTOP)

        async def standby_leads() -> bool:
            return await _role(standby.ready["grpc"]) == "leader"

        await assert_eventually(standby_leads, timeout_s=FAILOVER_BOUND_S * 2, interval_s=0.02)
        failover_s = time.monotonic() - faulted_at

        async def router_followed() -> bool:
            return any(started >= faulted_at for started, _ in load.spans)

        await assert_eventually(router_followed, timeout_s=FAILOVER_BOUND_S * 2, interval_s=0.02)
        router_s = min(answered for started, answered in load.spans if started >= faulted_at) - faulted_at
        slowest_s = max(answered - started for started, answered in load.spans if answered >= faulted_at)
        print(
            f"\n{fault.name} {store_args[0]}: failover {failover_s:.2f}s, router follows {router_s:.2f}s, "
            f"slowest turn across it {slowest_s:.2f}s"
        )
        await asyncio.sleep(1.5)  # the load goes on at the new leader
        if fault is signal.SIGSTOP:
            leader.send_signal(signal.SIGCONT)  # the deposed leader wakes up

            async def stood_down() -> bool:
                return await _role(leader.ready["grpc"]) == "standby"

            await assert_eventually(stood_down, timeout_s=5, interval_s=0.05)
            await asyncio.sleep(1.0)
            assert "stepping down from epoch" in leader.log_text()
        load.stop.set()
        await asyncio.wait_for(running, timeout=30)

        assert not load.errors, load.errors[:3]
        assert failover_s <= FAILOVER_BOUND_S and router_s <= FAILOVER_BOUND_S
        assert await stack.metric(url, "bandmaster_router_scheduler_fail_open_total") == 0
        new = standby.ready["grpc"]
        table = await _programs(new)
        assert set(load.turns) <= set(table), "programs lost"
        assert {sid: table[sid] for sid in load.turns} == load.turns, "scheduler turns != client turns"
        # What the store holds is the new leader's table: the deposed one wrote nothing over it.
        await asyncio.sleep(0.5)
        stored = await _stored(store_args)
        assert {sid: stored.get(sid) for sid in load.turns} == load.turns
    finally:
        await st.close()  # a stopped process is continued, then terminated


async def test_sigkilled_leader_on_sqlite(tmp_path):
    await _failover(tmp_path, ["--state-path", str(tmp_path / "shared.sqlite")], signal.SIGKILL)


async def test_sigkilled_leader_on_redis(tmp_path, redis_server):
    await _failover(tmp_path, ["--state-redis-url", redis_server.url], signal.SIGKILL)


async def test_sigstopped_leader_on_sqlite_is_deposed_and_writes_nothing_when_it_wakes(tmp_path):
    await _failover(tmp_path, ["--state-path", str(tmp_path / "shared.sqlite")], signal.SIGSTOP)


async def test_sigstopped_leader_on_redis_is_deposed_and_writes_nothing_when_it_wakes(tmp_path, redis_server):
    await _failover(tmp_path, ["--state-redis-url", redis_server.url], signal.SIGSTOP)


async def test_redis_frozen_under_the_pair_the_leader_steps_down_then_a_leader_decides_with_the_table(
    tmp_path, scripted_capacity, redis_server
):
    """The store itself stops answering: the leader cannot renew, so it stops deciding by itself within the
    lease (no replica decides without the store); once Redis answers again a leader is elected and decides
    with the whole table."""
    from tests.faults.support import Client

    flags = ["--leader-election", "--state-redis-url", redis_server.url, "--state-write-timeout-seconds", "0.5"]
    pair = [await start_scheduler(tmp_path, scripted_capacity.address, *flags, name=name) for name in ("s-a", "s-b")]
    try:
        addresses = [p.ready["grpc"] for p in pair]

        async def one_leader() -> str | None:
            roles = {a: await _role(a) for a in addresses}
            leaders = [a for a, r in roles.items() if r == "leader"]
            return leaders[0] if len(leaders) == 1 else None

        await assert_eventually(one_leader, timeout_s=10)
        client = Client.connect(await one_leader())
        try:
            await client.wait_replicas(1)
            for i in range(5):
                await client.turn(f"p{i}", f"p{i}-1", 100 + i)
        finally:
            await client.close()
        redis_server.signal(signal.SIGSTOP)
        try:
            frozen_at = time.monotonic()

            async def nobody_leads() -> bool:
                return all([await _role(a) == "standby" for a in addresses])

            await assert_eventually(nobody_leads, timeout_s=5, interval_s=0.05)
            assert time.monotonic() - frozen_at <= 2.5  # the lease (2 s) less the margin, plus polling
        finally:
            redis_server.signal(signal.SIGCONT)
        await assert_eventually(one_leader, timeout_s=10)
        table = await _programs(await one_leader())
        assert table == {f"p{i}": 1 for i in range(5)}
    finally:
        for proc in pair:
            await proc.stop_async()


@pytest.mark.parametrize("leader_survives", [True, False], ids=["leader-kept-the-table", "leader-gone-too"])
async def test_redis_restarted_without_its_data_under_the_pair_keeps_the_table(
    tmp_path, scripted_capacity, redis_server, leader_survives
):
    """Redis is killed and comes back empty (no persistence) after the leader stepped down for want of
    renewals. The replica that led keeps its table and writes it back: the next leader decides with every
    program (chaos defect 4: the next term loaded the empty store, "recovered 0 programs"). If the old
    leader is gone as well, the standby waits out the grace and starts empty."""
    from tests.faults.support import Client

    flags = ["--leader-election", "--state-redis-url", redis_server.url, "--state-write-timeout-seconds", "0.5"]
    pair = [await start_scheduler(tmp_path, scripted_capacity.address, *flags, name=name) for name in ("s-a", "s-b")]
    try:
        addresses = [p.ready["grpc"] for p in pair]

        async def one_leader() -> str | None:
            roles = {a: await _role(a) for a in addresses}
            leaders = [a for a, r in roles.items() if r == "leader"]
            return leaders[0] if len(leaders) == 1 else None

        await assert_eventually(one_leader, timeout_s=10)
        first = await one_leader()
        client = Client.connect(first)
        try:
            await client.wait_replicas(1)
            for i in range(5):
                await client.turn(f"p{i}", f"p{i}-1", 100 + i)
        finally:
            await client.close()
        redis_server.kill()

        async def nobody_leads() -> bool:
            return all([await _role(a) in ("standby", "down") for a in addresses])

        await assert_eventually(nobody_leads, timeout_s=5, interval_s=0.05)
        if not leader_survives:
            next(p for p in pair if p.ready["grpc"] == first).kill()
        redis_server.start()  # the same port, no data
        await assert_eventually(one_leader, timeout_s=15)
        leader = await one_leader()
        table = await _programs(leader)
        if leader_survives:
            assert leader == first
            assert table == {f"p{i}": 1 for i in range(5)}
            text = next(p for p in pair if p.ready["grpc"] == first).log_text()
            assert "holds no table (it lost its data)" in text
            # ... and it is in the store again.
            await asyncio.sleep(0.5)
            stored = await _stored(["--state-redis-url", redis_server.url])
            assert stored == {f"p{i}": 1 for i in range(5)}
        else:
            assert table == {}
            standby = next(p for p in pair if p.ready["grpc"] == leader)
            assert "leaving the lease" in standby.log_text()
    finally:
        for proc in pair:
            await proc.stop_async()
