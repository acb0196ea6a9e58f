"""`make bench-router-memory` / `python -m bench.router_memory`: a router process's resident memory per
10,000 programs, and whether it stays flat over a 10-minute run (issue 24).

    python -m bench.router_memory --out bench/results/router_memory.json [--quick] [--programs 10000]
                                  [--turns 3] [--steady-s 600] [--steady-turns-per-s 40] [--concurrency 8]

The stack is started as `bandmaster up` starts it (`services.launcher.cluster.start_cluster`: simulated
workers at a high `--speedup` with `--max-tokens` outputs, so that they cost little, then capacity,
scheduler and router), and this process drives the router's OpenAI API (`/v1/chat/completions`, streamed)
as agent harnesses do: a program is its `X-Dynamo-Session-ID`, each turn re-sends the conversation so far
(a shared system prompt, then `--turn-chars` characters of the program's own per turn and a short
answer; compacted to its last `--turns` turns), and `X-Dynamo-Session-Final: true` ends it. Requests come
from `--clients` clients, one bearer token each (the router counts programs per client and holds at most
2,048 of one client by default).

1. warm-up and idle: `--warmup-programs` programs (all their turns, then their finals: the first requests
   import lazily and size buffers), then the router's and the scheduler's VmRSS: the median of three
   samples a second apart.
2. load: `--programs` distinct programs, `--turns` turns each, `--concurrency` requests at once (paced at
   `--load-turns-per-s`), and no final: every program stays open, its state held in the router (admission
   cache, client limits, session chain) and the scheduler. Then RSS loaded, and per 10,000 programs:
   (loaded - idle) * 10,000 / programs.
3. steady: `--steady-s` seconds at `--steady-turns-per-s` (at most `--concurrency` steps at once): each
   step is, with probability `--new-share`, a churn (the oldest open program's final request, then a new
   program's `--turns` turns) or else the next turn of a random open program (returning). The open
   population stays `--programs` programs of `--turns` turns' conversation each, so the state they hold
   is the same size throughout: what grows is a leak.
   Every `--sample-s` seconds the RSS of every child is read. The trend (`bench.rss.rss_trend`) is judged
   from `--settle-fraction` of the steady run: its least-squares slope, the medians of its halves and its
   band. Flat: the slope is below `FLAT_MIB_PER_MIN` (a leak of a few hundred bytes per program shows
   above it at the default churn).
4. release: every open program's final request; RSS after it, and the scheduler's table (empty again).

The JSON report holds the figures per phase, the request rates achieved, the CPU seconds of every
process, /proc/loadavg at each phase boundary (the machine is shared), the scheduler's counters, the
warnings in the services' logs and the RSS timeline. Exit status: 0 when every judged target passes (the
load and the steady run lost no turn; with a full run, router and scheduler flat), 1 otherwise, 2 on
invalid flags.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter, OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence

import aiohttp

from bench.config_flags import add_config_flags, config_from_args
from bench.machine import loadavg, machine
from bench.peers import wait_routable
from bench.rss import rss_kb, rss_trend
from bench.soak import cpu_seconds, log_problems, router_index_ttl, scheduler_stats
from services.common.settings.config import require
from services.common.settings.errors import ConfigError
from services.common.web.session_ids import FINAL_HEADER, SESSION_HEADER

MODEL = "bandmaster-sim"
FLAT_MIB_PER_MIN = 0.25
"""A flat service: its settled RSS slope is below this. The default steady run opens 10 new programs a second
(40 turns/s, half the steps churn, 3 turns each): a leak of 1 KiB per program climbs 0.6 MiB/min."""
JUDGED = ("router", "scheduler")
SYSTEM_PROMPT = "You are a coding agent working in a repository. " * 20
ANSWER = "Done; next step."


@dataclass(frozen=True)
class RouterMemoryConfig:
    """One run: the stack, the programs and the phases."""

    programs: int = 10_000
    """Distinct programs opened by the load phase, held open through the steady run."""
    turns: int = 3
    """Turns each program of the load phase takes."""
    clients: int = 50
    """Bearer tokens the requests are spread over (the router's per-client program cap is 2,048)."""
    concurrency: int = 8
    """Requests in flight at once (load and steady)."""
    warmup_programs: int = 100
    load_turns_per_s: float = 150.0
    """Paced rate of the warm-up's and the load's turns (0 = as fast as `concurrency` allows)."""
    steady_s: float = 600.0
    steady_turns_per_s: float = 40.0
    """Paced rate of steady turns (a churn's final is not counted as a turn)."""
    new_share: float = 0.5
    """Share of steady steps that retire the oldest program and start a new one."""
    settle_fraction: float = 0.25
    """The trend is judged from this share of the steady run on (the router's prefix index, TTL 120 s, has
    turned over by then at 600 s)."""
    sample_s: float = 5.0
    workers: int = 2
    speedup: float = 1000.0
    worker_kv_tokens: int = 4_194_304
    """Per worker: sized so that the open programs' retained contexts fit and nothing is paused."""
    turn_chars: int = 400
    max_tokens: int = 4
    turn_timeout_s: float = 60.0
    program_idle_s: float = 7200.0
    """The scheduler's `--program-idle-ttl-seconds` and the router's `--client-program-idle-seconds`: longer
    than the run, so that the open programs stay open. (`start_cluster` divides the scheduler's TTL by the
    workers' speedup, 900 s modelled: 0.9 s at 1000x, and an expired program is dropped by the routers too.)"""
    seed: int = 0

    def __post_init__(self) -> None:
        require(self.programs >= 1, "programs", self.programs, "programs >= 1")
        require(self.turns >= 1, "turns", self.turns, "turns >= 1")
        require(self.clients >= 1, "clients", self.clients, "clients >= 1")
        require(
            self.programs <= 2048 * self.clients,
            "programs",
            self.programs,
            "programs <= 2048 * clients (the router's default per-client program cap)",
        )
        require(self.concurrency >= 1, "concurrency", self.concurrency, "concurrency >= 1")
        require(self.warmup_programs >= 1, "warmup_programs", self.warmup_programs, "warmup_programs >= 1")
        require(self.load_turns_per_s >= 0, "load_turns_per_s", self.load_turns_per_s, "load_turns_per_s >= 0")
        require(self.steady_s > 0, "steady_s", self.steady_s, "steady_s > 0")
        require(self.steady_turns_per_s > 0, "steady_turns_per_s", self.steady_turns_per_s, "steady_turns_per_s > 0")
        require(0 <= self.new_share <= 1, "new_share", self.new_share, "0 <= new_share <= 1")
        require(0 <= self.settle_fraction < 1, "settle_fraction", self.settle_fraction, "0 <= settle_fraction < 1")
        require(self.sample_s > 0, "sample_s", self.sample_s, "sample_s > 0")
        require(
            self.steady_s * (1 - self.settle_fraction) >= 3 * self.sample_s,
            "sample_s",
            self.sample_s,
            "at least 3 samples after the steady run settles",
        )
        require(1 <= self.workers <= 64, "workers", self.workers, "1 <= workers <= 64")
        require(self.speedup > 0, "speedup", self.speedup, "speedup > 0")
        require(self.worker_kv_tokens >= 16, "worker_kv_tokens", self.worker_kv_tokens, "worker_kv_tokens >= 16")
        require(self.turn_chars >= 1, "turn_chars", self.turn_chars, "turn_chars >= 1")
        require(self.max_tokens >= 1, "max_tokens", self.max_tokens, "max_tokens >= 1")
        require(self.turn_timeout_s > 0, "turn_timeout_s", self.turn_timeout_s, "turn_timeout_s > 0")
        require(self.program_idle_s > 0, "program_idle_s", self.program_idle_s, "program_idle_s > 0")


FULL = RouterMemoryConfig()
QUICK = RouterMemoryConfig(
    programs=300,
    turns=2,
    clients=4,
    concurrency=8,
    warmup_programs=20,
    load_turns_per_s=0.0,
    steady_s=12.0,
    steady_turns_per_s=20.0,
    sample_s=1.0,
    worker_kv_tokens=262_144,
)
"""For the test suite: about 40 s in all, every field of the report (the trend of a 12 s run is noise)."""


# ------------------------------------------------------------------------------------ pure parts


def conversation(program: str, turn: int, turn_chars: int, window: int) -> list[dict]:
    """The messages of `program`'s turn number `turn` (1-based): the shared system prompt, then the user text
    (the program's own, `turn_chars` characters) of its last `window` turns, each but the last followed by the
    short answer. An agent re-sends its conversation every turn, so the router's session chain and prefix
    index see all of it; past `window` turns it is compacted to the latest ones (as agents summarise), so a
    program's prompt stops growing and the open programs' state stays the same size over a steady run."""
    filler = " tok" * (turn_chars // 4 + 1)
    messages = [{"role": "system", "content": SYSTEM_PROMPT}]
    for step in range(max(1, turn - window + 1), turn + 1):
        head = f"{program} step {step}:"
        messages.append({"role": "user", "content": (head + filler)[:turn_chars]})
        if step < turn:
            messages.append({"role": "assistant", "content": ANSWER})
    return messages


def client_token(program_index: int, clients: int) -> str:
    return f"Bearer router-memory-client-{program_index % clients}"


@dataclass(frozen=True)
class Step:
    """One steady step: `program`'s turns `first_turn`..`last_turn` (1-based) in order, after `final`'s final
    request if set."""

    program: str
    first_turn: int
    last_turn: int
    final: str | None = None

    @property
    def turns(self) -> int:
        return self.last_turn - self.first_turn + 1


class Population:
    """The open programs of the steady run. A step either retires the oldest program that is not mid-turn and
    opens a new one that takes `turns_done` turns at once, as the load phase's did (churn), or takes the next
    turn of a random open program that is not mid-turn (returning); the population's size never changes.
    Pure: the random source is passed in."""

    def __init__(self, programs: Iterable[str], turns_done: int, new_share: float, new_prefix: str) -> None:
        self.new_turns = turns_done
        self.turns_done: OrderedDict[str, int] = OrderedDict((p, turns_done) for p in programs)
        """Open program -> turns it took, oldest first."""
        self._ids = list(self.turns_done)
        self._index = {p: i for i, p in enumerate(self._ids)}
        self._busy: set[str] = set()
        self.new_share = new_share
        self.new_prefix = new_prefix
        self.opened = 0
        self.retired: list[str] = []

    def __len__(self) -> int:
        return len(self._ids)

    def step(self, rng: random.Random) -> Step | None:
        """The next step, its programs marked busy until `done`; None when every candidate is busy."""
        if rng.random() < self.new_share:
            oldest = next((p for p in self.turns_done if p not in self._busy), None)
            if oldest is None:
                return None
            self._remove(oldest)
            program = f"{self.new_prefix}{self.opened}"
            self.opened += 1
            self._add(program)
            self._busy.add(program)
            self.retired.append(oldest)
            return Step(program, 1, self.new_turns, final=oldest)
        for _ in range(8):  # a handful of draws: at most `concurrency` of many programs are busy
            program = self._ids[rng.randrange(len(self._ids))]
            if program not in self._busy:
                self._busy.add(program)
                turn = self.turns_done[program] + 1
                return Step(program, turn, turn)
        return None

    def done(self, step: Step) -> None:
        """The step's turn was answered (or failed: the turn counts as taken either way)."""
        self._busy.discard(step.program)
        if step.program in self.turns_done:
            self.turns_done[step.program] = step.last_turn

    def _add(self, program: str) -> None:
        self.turns_done[program] = 0
        self._index[program] = len(self._ids)
        self._ids.append(program)

    def _remove(self, program: str) -> None:
        del self.turns_done[program]
        i = self._index.pop(program)
        last = self._ids.pop()
        if last != program:  # swap the last id into the hole
            self._ids[i] = last
            self._index[last] = i


def per_10k_kb(before_kb: int | None, after_kb: int | None, programs: int) -> int | None:
    """RSS growth per 10,000 programs, from the growth over `programs` of them."""
    if before_kb is None or after_kb is None or programs <= 0:
        return None
    return round((after_kb - before_kb) * 10_000 / programs)


def flat(trend: dict) -> bool | None:
    """Flat: the settled slope is below FLAT_MIB_PER_MIN (None: too few samples to tell)."""
    slope = trend["rss_kb_slope_per_min"]
    return None if slope is None else slope < FLAT_MIB_PER_MIN * 1024


def targets(load: dict, steady: dict, *, judge_memory: bool) -> list[dict]:
    lost = load["turns_failed"] + steady["turns_failed"] + steady["finals_failed"]
    held = (load["scheduler_programs_active"], steady["scheduler_programs_active"])
    rows = [
        {
            "name": "turns and finals failed (load + steady)",
            "value": lost,
            "needs": "== 0",
            "status": "PASS" if lost == 0 else "MISS",
            "judged": True,
        },
        {
            # The figures are about open programs: a program the scheduler expired is dropped by the router.
            "name": "programs open at the scheduler after the load, after the steady run",
            "value": list(held),
            "needs": f"== {load['programs']} both",
            "status": "PASS" if held == (load["programs"], load["programs"]) else "MISS",
            "judged": True,
        },
        {
            "name": "router RSS per 10,000 programs",
            "value_mib": round(load["router_kb_per_10k_programs"] / 1024, 1)
            if load["router_kb_per_10k_programs"] is not None
            else None,
            "needs": "reported",
            "status": "REPORTED",
            "judged": False,
        },
    ]
    for name in JUDGED:
        trend = steady["trend"][name]
        is_flat = flat(trend)
        slope = trend["rss_kb_slope_per_min"]
        rows.append(
            {
                "name": f"{name} RSS flat over the steady run",
                "value_mib_per_min": round(slope / 1024, 3) if slope is not None else None,
                "needs": f"settled slope < {FLAT_MIB_PER_MIN} MiB/min",
                "status": "PASS" if is_flat else "MISS",
                "judged": judge_memory,
            }
        )
    return rows


def passed(report: dict) -> bool:
    return not report["services_exited"] and all(t["status"] == "PASS" for t in report["targets"] if t["judged"])


# ------------------------------------------------------------------------------------ the load


class Pacer:
    """Spaces work at `per_s` units a second (0: no pacing). Behind schedule (a slow stretch on a shared
    machine), it carries on at the rate from now rather than bursting to catch up."""

    def __init__(self, per_s: float) -> None:
        self.interval_s = 1.0 / per_s if per_s > 0 else 0.0
        self.next_at = time.monotonic()

    async def take(self, units: int) -> None:
        if not self.interval_s:
            return
        now = time.monotonic()
        start = max(self.next_at, now)
        self.next_at = start + units * self.interval_s
        if start > now:
            await asyncio.sleep(start - now)


@dataclass
class Tally:
    turns_ok: int = 0
    turns_failed: int = 0
    finals_ok: int = 0
    finals_failed: int = 0
    errors: Counter[str] | None = None

    def __post_init__(self) -> None:
        self.errors = Counter()

    def as_dict(self) -> dict:
        assert self.errors is not None
        return {
            "turns_ok": self.turns_ok,
            "turns_failed": self.turns_failed,
            "finals_ok": self.finals_ok,
            "finals_failed": self.finals_failed,
            "errors_by_kind": dict(self.errors.most_common()),
        }


class Driver:
    """Sends turns and finals to the router's OpenAI API and counts them."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, config: RouterMemoryConfig) -> None:
        self.session = session
        self.url = base_url + "/v1/chat/completions"
        self.config = config
        self.tally = Tally()

    def _headers(self, program: str) -> dict[str, str]:
        # The client index is the number after the program's last '-' (every id here ends in one).
        index = int(program.rsplit("-", 1)[1])
        return {SESSION_HEADER: program, "Authorization": client_token(index, self.config.clients)}

    async def turn(self, program: str, turn: int) -> bool:
        c = self.config
        body = {
            "model": MODEL,
            "stream": True,
            "max_tokens": c.max_tokens,
            "ignore_eos": True,
            "messages": conversation(program, turn, c.turn_chars, c.turns),
        }
        tally = self.tally
        assert tally.errors is not None
        try:
            async with self.session.post(self.url, json=body, headers=self._headers(program)) as response:
                if response.status != 200:
                    await response.read()
                    tally.turns_failed += 1
                    tally.errors[f"http_{response.status}"] += 1
                    return False
                chunks, done = 0, False
                # Byte tests, no JSON per line: this process shares two cores with the stack.
                async for line in response.content:
                    if b'"content":"' in line:
                        chunks += 1
                    elif line.startswith(b"data: [DONE]"):
                        done = True
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            tally.turns_failed += 1
            tally.errors[f"transport_{type(exc).__name__}"] += 1
            return False
        if not done or chunks == 0:
            tally.turns_failed += 1
            tally.errors["short_stream"] += 1
            return False
        tally.turns_ok += 1
        return True

    async def final(self, program: str) -> bool:
        headers = {**self._headers(program), FINAL_HEADER: "true"}
        tally = self.tally
        assert tally.errors is not None
        try:
            async with self.session.post(self.url, json={"model": MODEL, "messages": []}, headers=headers) as response:
                await response.read()
                ok = response.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            tally.finals_failed += 1
            tally.errors[f"final_transport_{type(exc).__name__}"] += 1
            return False
        if not ok:
            tally.finals_failed += 1
            tally.errors[f"final_http_{response.status}"] += 1
            return False
        tally.finals_ok += 1
        return True

    async def programs(self, ids: Sequence[str], turns: int, pacer: Pacer, *, final: bool) -> None:
        """Every program in `ids` takes `turns` turns in order (then its final, with `final`),
        `concurrency` programs at once, each program's turns paced by `pacer`."""
        queue = iter(ids)

        async def lane() -> None:
            for program in queue:
                await pacer.take(turns)
                for turn in range(1, turns + 1):
                    await self.turn(program, turn)
                if final:
                    await self.final(program)

        await asyncio.gather(*(lane() for _ in range(self.config.concurrency)))

    async def steady(self, population: Population, seconds: float, rng: random.Random) -> dict:
        """Steps paced at `steady_turns_per_s` for `seconds`, at most `concurrency` at once; returns the
        counts of the phase."""
        pacer = Pacer(self.config.steady_turns_per_s)
        slots = asyncio.Semaphore(self.config.concurrency)
        tasks: set[asyncio.Task] = set()
        counts = Counter[str]()
        start = time.monotonic()
        end = start + seconds

        async def run(step: Step) -> None:
            try:
                if step.final is not None:
                    await self.final(step.final)
                for turn in range(step.first_turn, step.last_turn + 1):
                    await self.turn(step.program, turn)
            finally:
                population.done(step)
                slots.release()

        while time.monotonic() < end:
            await slots.acquire()
            step = population.step(rng)
            if step is None:
                slots.release()
                counts["skipped_all_busy"] += 1
                await asyncio.sleep(0.01)
                continue
            await pacer.take(step.turns)
            counts["churn" if step.final is not None else "returning"] += 1
            task = asyncio.create_task(run(step))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
        wall_s = time.monotonic() - start
        return {"wall_s": round(wall_s, 1), **counts}


class Sampler:
    """Every `interval_s`, the RSS of every child, the phase and the 1-minute load average, as one row."""

    def __init__(self, pids: dict[str, int], interval_s: float) -> None:
        self.pids = pids
        self.interval_s = interval_s
        self.start = time.monotonic()
        self.phase = "idle"
        self.timeline: list[dict] = []

    def sample(self) -> dict:
        avg = loadavg()
        row = {
            "t_s": round(time.monotonic() - self.start, 2),
            "phase": self.phase,
            "loadavg_1m": avg[0] if avg else None,
            "rss_kb": {name: rss_kb(pid) for name, pid in self.pids.items()},
        }
        self.timeline.append(row)
        return row

    async def run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.interval_s)

    async def settled(self, samples: int = 3, gap_s: float = 1.0) -> dict[str, int | None]:
        """Per child, the median of `samples` readings `gap_s` apart (one reading can catch a transient)."""
        rows = []
        for i in range(samples):
            if i:
                await asyncio.sleep(gap_s)
            rows.append(self.sample())
        out: dict[str, int | None] = {}
        for name in self.pids:
            values = [r["rss_kb"][name] for r in rows if r["rss_kb"][name] is not None]
            out[name] = int(statistics.median(values)) if values else None
        return out


# ------------------------------------------------------------------------------------ the shell


def _mib(kb: int | None) -> str:
    return f"{kb / 1024:.1f}" if kb is not None else "-"


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _cpu(pids: dict[str, int]) -> dict[str, float | None]:
    return {name: cpu_seconds(pid) for name, pid in pids.items()}


def _cpu_delta(before: dict, after: dict) -> dict[str, float | None]:
    return {
        name: round(after[name] - before[name], 2)
        if before.get(name) is not None and after.get(name) is not None
        else None
        for name in before
    }


async def _measure(
    base_url: str, scheduler_addr: str, pids: dict[str, int], config: RouterMemoryConfig, phases: dict
) -> None:
    """The four phases; fills `phases` as it goes (the caller reads the scheduler and the logs after)."""
    rng = random.Random(config.seed)
    sampler = Sampler(pids, config.sample_s)
    connector = aiohttp.TCPConnector(limit=config.concurrency + 4)
    timeout = aiohttp.ClientTimeout(total=config.turn_timeout_s, sock_connect=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        driver = Driver(session, base_url, config)
        # 1. warm-up, then idle
        sampler.phase = "warmup"
        warmup = [f"warmup-{i}" for i in range(config.warmup_programs)]
        await driver.programs(warmup, config.turns, Pacer(config.load_turns_per_s), final=True)
        await asyncio.sleep(2.0)
        sampler.phase = "idle"
        idle = await sampler.settled()
        phases["idle"] = {"rss_kb": idle, "loadavg": loadavg(), "warmup": driver.tally.as_dict()}
        _log(f"bench.router_memory: idle router {_mib(idle['router'])} MiB, scheduler {_mib(idle['scheduler'])} MiB")
        sampling = asyncio.create_task(sampler.run())
        try:
            # 2. load: distinct programs held open
            sampler.phase = "load"
            driver.tally = Tally()
            ids = [f"program-{i}" for i in range(config.programs)]
            cpu_before, started = _cpu(pids), time.monotonic()
            await driver.programs(ids, config.turns, Pacer(config.load_turns_per_s), final=False)
            wall_s = time.monotonic() - started
            cpu_load = _cpu_delta(cpu_before, _cpu(pids))
            router_cpu_s = cpu_load.get("router")
            sampler.phase = "loaded"
            loaded = await sampler.settled()
            tally = driver.tally.as_dict()
            held = await asyncio.to_thread(scheduler_stats, scheduler_addr)
            phases["load"] = {
                **tally,
                "programs": config.programs,
                "scheduler_programs_active": held["programs_active"],
                "wall_s": round(wall_s, 1),
                "turns_per_s": round(tally["turns_ok"] / wall_s, 1) if wall_s else None,
                "cpu_s": cpu_load,
                "router_cpu_ms_per_turn": round(router_cpu_s * 1000 / tally["turns_ok"], 2)
                if tally["turns_ok"] and router_cpu_s is not None
                else None,
                "rss_kb": loaded,
                "router_kb_per_10k_programs": per_10k_kb(idle["router"], loaded["router"], config.programs),
                "scheduler_kb_per_10k_programs": per_10k_kb(idle["scheduler"], loaded["scheduler"], config.programs),
                "loadavg": loadavg(),
            }
            _log(
                f"bench.router_memory: {config.programs} programs open after {wall_s:.0f}s "
                f"({phases['load']['turns_per_s']} turns/s): router {_mib(loaded['router'])} MiB "
                f"({_mib(phases['load']['router_kb_per_10k_programs'])} MiB per 10k programs)"
            )
            # 3. steady: churn and returning turns over the open population
            sampler.phase = "steady"
            driver.tally = Tally()
            population = Population(ids, config.turns, config.new_share, "steady-")
            steady_start_t = time.monotonic() - sampler.start
            cpu_before = _cpu(pids)
            progress = asyncio.create_task(_progress(sampler, config.steady_s))
            counts = await driver.steady(population, config.steady_s, rng)
            progress.cancel()
            cpu_steady = _cpu_delta(cpu_before, _cpu(pids))
            sampler.sample()
            held = await asyncio.to_thread(scheduler_stats, scheduler_addr)
            steady_rows = [r for r in sampler.timeline if r["phase"] == "steady"]
            tally = driver.tally.as_dict()
            settle_s = config.steady_s * config.settle_fraction
            trend = {}
            for name in pids:
                samples = [
                    (r["t_s"] - steady_start_t, r["rss_kb"][name]) for r in steady_rows if r["rss_kb"][name] is not None
                ]
                trend[name] = rss_trend(samples, settle_s)
                trend[name]["rss_kb_max"] = max((v for _, v in samples), default=None)
            phases["steady"] = {
                **tally,
                **counts,
                "target_turns_per_s": config.steady_turns_per_s,
                "turns_per_s": round(tally["turns_ok"] / counts["wall_s"], 2) if counts["wall_s"] else None,
                "new_programs": population.opened,
                "open_programs": len(population),
                "scheduler_programs_active": held["programs_active"],
                "cpu_s": cpu_steady,
                "trend": trend,
                "loadavg": loadavg(),
            }
            # 4. release every open program
            sampler.phase = "release"
            driver.tally = Tally()
            open_ids = list(population.turns_done)
            queue = iter(open_ids)

            async def lane() -> None:
                for program in queue:
                    await driver.final(program)

            await asyncio.gather(*(lane() for _ in range(config.concurrency)))
            await asyncio.sleep(2.0)
            released = await sampler.settled()
            phases["release"] = {**driver.tally.as_dict(), "programs": len(open_ids), "rss_kb": released}
        finally:
            sampling.cancel()
            await asyncio.gather(sampling, return_exceptions=True)
    phases["timeline"] = sampler.timeline


async def _progress(sampler: Sampler, steady_s: float) -> None:
    every_s = max(sampler.interval_s, min(60.0, steady_s / 10))
    while True:
        await asyncio.sleep(every_s)
        row = sampler.timeline[-1] if sampler.timeline else None
        if row:
            rss = " ".join(f"{n}={(v or 0) / 1024:.1f}M" for n, v in row["rss_kb"].items() if n in JUDGED)
            _log(f"bench.router_memory: t={row['t_s']:.0f}s {row['phase']} {rss} load {row['loadavg_1m']}")


def run(config: RouterMemoryConfig, *, quick: bool = False) -> dict:
    from services.launcher.cluster import ClusterConfig, start_cluster
    from services.launcher.probes import wait_for_workers

    state_dir = Path(tempfile.mkdtemp(prefix="bandmaster-router-memory-"))
    loadavg_start = loadavg()
    cluster = start_cluster(
        ClusterConfig(
            workers=config.workers,
            worker_kv_tokens=config.worker_kv_tokens,
            worker_speedup=config.speedup,
            model_name=MODEL,
            http_port=0,
            state_dir=state_dir,
            log_level="WARNING",
            extra_worker_args=("--log-level", "WARNING"),
            scheduler_args=("--program-idle-ttl-seconds", f"{config.program_idle_s:g}"),
            router_args=("--client-program-idle-seconds", f"{config.program_idle_s:g}"),
        )
    )
    phases: dict = {}
    try:
        assert cluster.capacity is not None and cluster.scheduler is not None
        wait_for_workers(cluster.capacity.endpoint, config.workers)
        wait_routable(cluster.http_url, MODEL, lambda: not cluster.supervisor.failed())
        pids = {child.spec.name: child.process.pid for child in cluster.supervisor.children}
        _log(
            f"bench.router_memory: {config.programs} programs x {config.turns} turns, then {config.steady_s:g}s "
            f"at {config.steady_turns_per_s:g} turns/s; {config.workers} simulated workers at {config.speedup:g}x"
        )
        cpu_start = _cpu(pids)
        asyncio.run(_measure(cluster.http_url, cluster.scheduler.endpoint, pids, config, phases))
        cpu_total = _cpu_delta(cpu_start, _cpu(pids))
        exited = [c.spec.name for c in cluster.supervisor.failed()]
        scheduler = scheduler_stats(cluster.scheduler.endpoint)
        index_ttl_s = router_index_ttl(cluster.scheduler.endpoint)
        logs = {c.spec.name: c.log_path for c in cluster.supervisor.children}
    finally:
        cluster.stop()
    problems = {}
    for name, path in logs.items():
        found = log_problems(path.read_text(errors="replace").splitlines())
        if found:
            problems[name] = found
    report = build_report(
        config, phases, scheduler, exited, problems, cpu_total, index_ttl_s, loadavg_start, quick=quick
    )
    if passed(report):
        shutil.rmtree(state_dir, ignore_errors=True)
    else:
        _log(f"bench.router_memory: the services' logs are kept in {state_dir}")
    return report


def build_report(
    config: RouterMemoryConfig,
    phases: dict,
    scheduler: dict,
    exited: list[str],
    problems: dict,
    cpu_total: dict,
    index_ttl_s: float,
    loadavg_start: list[float] | None,
    *,
    quick: bool,
) -> dict:
    return {
        "benchmark": "router_memory",
        "quick": quick,
        "config": asdict(config),
        "flat_mib_per_min": FLAT_MIB_PER_MIN,
        "idle": phases["idle"],
        "load": phases["load"],
        "steady": phases["steady"],
        "release": phases["release"],
        "scheduler": scheduler,
        "router_index_ttl_s": index_ttl_s,
        "cpu_s": cpu_total,
        "services_exited": exited,
        "service_log_problems": problems,
        "machine": machine(loadavg_start=loadavg_start, loadavg_end=loadavg()),
        "targets": targets(phases["load"], phases["steady"], judge_memory=not quick),
        "timeline": phases["timeline"],
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def text_summary(report: dict) -> str:
    mib = _mib
    idle, load, steady, release = report["idle"], report["load"], report["steady"], report["release"]
    lines = [
        f"idle: router {mib(idle['rss_kb']['router'])} MiB, scheduler {mib(idle['rss_kb']['scheduler'])} MiB "
        f"(load average {idle['loadavg']})",
        f"load: {load['programs']} programs x {report['config']['turns']} turns in {load['wall_s']}s "
        f"({load['turns_per_s']} turns/s, router {load['router_cpu_ms_per_turn']} ms CPU a turn), "
        f"{load['turns_failed']} failed; router {mib(load['rss_kb']['router'])} MiB = "
        f"{mib(load['router_kb_per_10k_programs'])} MiB per 10,000 programs; scheduler "
        f"{mib(load['rss_kb']['scheduler'])} MiB = {mib(load['scheduler_kb_per_10k_programs'])} MiB per 10,000 "
        f"(load average {load['loadavg']})",
        f"steady: {steady['wall_s']}s at {steady['turns_per_s']} turns/s (target {steady['target_turns_per_s']:g}), "
        f"{steady['new_programs']} new programs, {steady['turns_failed']} turns and {steady['finals_failed']} finals "
        f"failed (load average {steady['loadavg']})",
    ]
    for name in JUDGED:
        t = steady["trend"][name]
        slope = t["rss_kb_slope_per_min"]
        band = t["rss_kb_band_settled"]
        lines.append(
            f"  {name:9s} from {t['settle_s']:g}s: slope "
            f"{(f'{slope / 1024:+.3f}' if slope is not None else '-')} MiB/min, band {mib(band[0])}-{mib(band[1])} "
            f"MiB, medians of the halves {mib(t['rss_kb_median_first_half'])} / "
            f"{mib(t['rss_kb_median_second_half'])} MiB"
        )
    lines.append(
        f"release: {release['programs']} finals ({release['finals_failed']} failed): router "
        f"{mib(release['rss_kb']['router'])} MiB; scheduler table {report['scheduler'].get('programs_active')} programs"
    )
    if report["service_log_problems"]:
        lines.append(f"warnings and errors in the services' logs: {report['service_log_problems']}")
    for target in report["targets"]:
        value = target.get("value", target.get("value_mib", target.get("value_mib_per_min")))
        judged = "" if target["judged"] or target["status"] == "REPORTED" else " (not judged: --quick)"
        lines.append(f"{target['status']} {target['name']}: {value} (needs {target['needs']}){judged}")
    if report["services_exited"]:
        lines.append(f"MISS services exited during the run: {', '.join(report['services_exited'])}")
    return "\n".join(lines)


FLAGS = (
    ("programs", int),
    ("turns", int),
    ("clients", int),
    ("concurrency", int),
    ("warmup_programs", int),
    ("load_turns_per_s", float),
    ("steady_s", float),
    ("steady_turns_per_s", float),
    ("new_share", float),
    ("settle_fraction", float),
    ("sample_s", float),
    ("workers", int),
    ("speedup", float),
    ("worker_kv_tokens", int),
    ("turn_chars", int),
    ("max_tokens", int),
    ("turn_timeout_s", float),
    ("program_idle_s", float),
    ("seed", int),
)
"""RouterMemoryConfig fields with a flag (`--steady-s` for `steady_s`); an unset flag keeps FULL's or QUICK's."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.router_memory", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/router_memory.json"))
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"small and short, for the test suite ({QUICK.programs} programs, {QUICK.steady_s:g}s steady)",
    )
    add_config_flags(parser, FLAGS, FULL, QUICK)
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args, FLAGS, FULL, QUICK)
    except ConfigError as exc:
        _log(f"bench.router_memory: {exc}")
        return 2
    report = run(config, quick=args.quick)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(text_summary(report))
    print(f"wrote {args.out}")
    return 0 if passed(report) else 1


if __name__ == "__main__":
    sys.exit(main())
