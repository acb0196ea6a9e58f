"""The discrete-event loop: programs, router, scheduler and engines in virtual time, no processes.

One heap of timed events drives everything. Per turn it follows the live request path
(clients/player.py -> services/router/turn/turns.py -> simworker):

    turn start (client sends)          t0
    Admit (scheduler core)             t0 + request_overhead_s (+ the live path's client, parsing and
                                       admission costs, with `live_path`); WAIT -> held until a
                                       Decision with the same request id comes back in some call's Effects
    pick + commit (router core), Bind  same instant (round_robin: the next worker in turn)
    engine.submit                      + the profile's frontend latency (the live simworker sleeps it)
                                       (+ the live path's router -> worker and parsing costs)
    engine steps                       step(now) when a worker is idle and has work, or when its
                                       previous step ends; outputs are delivered at now + duration;
                                       pure-decode stretches as one event (plan_decode /
                                       commit_decode, cut at the first step boundary after an
                                       arrival; see docs/simulator.md "Decode runs")
    first token -> router first_token; last token -> router finish, Complete (scheduler core)
    tool wait, next turn ...           after the live path's relay, if modelled; after the last
                                       turn: Release (the final request)

Scheduler ticks run every `scheduler_interval_seconds`; each held admission also gets a timer at
its forced-resume deadline. Every arm samples a per-worker timeline at the tick times.
Deterministic for a scenario: ties in time are broken by insertion order, and the only
randomness (router ties, workload texts) comes from seeded sources.
"""

from __future__ import annotations

import bisect
import gc
import heapq
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from clients.player import SYSTEM_PROMPT_TOKENS, ProgramRecord, RunResult, TurnRecord
from clients.workloads import Program
from harness.peers import Wake
from harness.simlib.conversation import Conversation
from harness.simlib.scenario import SimScenario, worker_id
from services.router.core.kv_router import KvRouterCore
from services.router.core.select import Candidate
from services.router.core.types import Replica
from services.scheduler.core.model import (
    CapacitySnapshot,
    Decision,
    Effects,
    EventKind,
    ReplicaKey,
    TurnOutcome,
    Verdict,
)
from services.scheduler.core.params import ControlParams
from services.scheduler.core.scheduler import SchedulerCore
from services.simworker.core.api import EngineRequest, RequestOutput, StepResult
from services.simworker.core.tokenizer import ids_of_n_tokens, text_of_n_tokens

# Event kinds, in the order they run when due at the same instant with equal insertion order.
_TURN, _ADMIT, _ARRIVE, _KICK, _STEP_END, _DEADLINE, _TICK, _SWEEP, _RUN_END, _PEER = range(10)

# Longest pure-decode run planned as one event (see SimEngine.plan_decode).
MAX_RUN_STEPS = 512

_SCHEDULER_EVENTS = {
    EventKind.PAUSED: "pause",
    EventKind.RESUMED: "resume",
    EventKind.FORCED_RESUME: "forced_resume",
    EventKind.MARKED: "mark",
    EventKind.SOFT_DEMOTED: "soft_demote",
}

# The columns of each worker's timeline sample (report()["timeline"]["workers"][w][i]).
TIMELINE_COLUMNS = (
    "t_s",
    "utilisation",
    "utilisation_decayed",
    "band",
    "reasoning_programs",
    "resident_programs",
    "engine_token_usage",
    "engine_running",
    "engine_queued",
    "pauses",
    "resumes",
    "marks",
    "soft_demotes",
)


@dataclass
class _ProgramRun:
    index: int
    program: Program
    record: ProgramRecord
    conversation: Conversation
    rng: random.Random
    started_s: float
    turn: int = 0


@dataclass
class _TurnRun:
    request_id: str
    run: _ProgramRun
    k: int
    sent_s: float
    output_tokens: int
    prompt_ids: Sequence[int] = ()
    decision: Decision | None = None
    worker: int = -1
    dispatched_s: float = 0.0
    first_token_s: float | None = None
    output_ids: list[int] = field(default_factory=list)
    # For the per-turn breakdown (SimResult.turn_phases): when the admission call was made, when the
    # request reached the engine and when the engine first admitted it; the live path's modelled costs.
    admit_s: float = 0.0
    arrive_s: float = 0.0
    engine_admitted_s: float | None = None
    before_admission_s: float = 0.0
    dispatch_s: float = 0.0
    # Simulated seconds per wall second of the live path's costs before the admission and at the
    # dispatch (the live speedup, times this turn's draws with a `variant`).
    before_scale: float = 0.0
    dispatch_scale: float = 0.0
    frontend_s: float = 0.0
    estimated_tokens: int = 0


@dataclass
class _Worker:
    index: int
    worker_id: str
    engine: Any
    profile: Any
    replica: Replica
    key: ReplicaKey
    busy: bool = False  # a step is in progress (its end event is queued) or a kick is queued
    run: tuple[float, ...] | None = None  # end times of the planned decode run in progress
    run_steps: int = 0  # how many of them will be committed (cut by arrivals)
    run_generation: int = 0  # ignores the end events of runs that were cut
    run_committed: int = 0  # steps of the run already applied to the engine (see _catch_up)
    run_outputs: tuple = ()  # outputs of a run committed to its end before the end came


@dataclass
class SimResult:
    """What `simulate` returns: the live runner's RunResult plus the simulator's own records."""

    scenario: SimScenario
    run: RunResult
    worker_counters: dict[str, dict[str, int]]
    scheduler_counters: dict[str, float]
    timeline: dict[str, Any]
    cpu_s: float
    events: int
    completed: bool
    steady: dict = field(default_factory=dict)
    """`steady_state` of the run: throughput between warm-up and the last program's start."""
    oracle_worker_kv_tokens: int | None = None
    """The oracle arm's GPU KV per worker (None in the other arms)."""
    turn_phases: list[dict] = field(default_factory=list)
    """Per completed turn, where its time went in simulated seconds, by bench/breakdown.py's phases
    (None = no such phase in this run) and `total` (the client's turn time)."""

    def summary(self) -> dict:
        """clients/player.py's summary keys (wall_s and simulated_minutes are simulated time here),
        the steady-state throughput, then the simulator's cost."""
        out = self.run.summary()
        out.update(self.steady)
        if self.oracle_worker_kv_tokens is not None:
            out["oracle_worker_kv_tokens"] = self.oracle_worker_kv_tokens
        out["sim_cpu_s"] = round(self.cpu_s, 3)
        out["sim_events"] = self.events
        out["sim_completed"] = self.completed
        # Cost figures: programs simulated per CPU-second, and simulated seconds per CPU-second.
        out["sim_programs_per_cpu_s"] = round(out["programs_done"] / self.cpu_s, 3) if self.cpu_s > 0 else 0.0
        out["sim_speed_x"] = round(self.run.wall_s / self.cpu_s, 1) if self.cpu_s > 0 else 0.0
        return out

    def report(self) -> dict:
        return {
            "summary": self.summary(),
            "scheduler": self.scheduler_counters,
            "workers": self.worker_counters,
            "timeline": self.timeline,
            "turns": [asdict(t) for t in self.run.turns],
            "programs": [asdict(p) for p in self.run.programs],
        }


class Simulator:
    def __init__(self, scenario: SimScenario) -> None:
        self.s = scenario
        self.now = 0.0
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self.events = 0
        self.programs = scenario.build_programs()
        # The oracle's workers have its unlimited pool; everything else is the scenario's.
        engines = scenario.engine_scenario(self.programs)
        self.oracle_worker_kv_tokens = engines.worker_kv_tokens if scenario.arm == "oracle" else None
        self.workers: list[_Worker] = []
        capacities = []
        for i in range(scenario.workers):
            engine, profile, capacity = engines.build_worker(i)
            wid = worker_id(i)
            self.workers.append(_Worker(i, wid, engine, profile, Replica(wid, 0), ReplicaKey(wid, 0)))
            capacities.append(capacity)
        self.capacities = tuple(capacities)
        self._by_key = {w.key: w for w in self.workers}
        self._by_replica = {w.replica: w for w in self.workers}
        self._candidates = [Candidate(w.replica) for w in self.workers]
        self.router: KvRouterCore | None = None
        if scenario.arm in ("kv", "bandmaster", "oracle"):
            self.router = KvRouterCore(scenario.router_params(), random.Random(scenario.draw_seed("router:")))
        # Turn-to-turn variation of the live path's costs: only another `variant` draws it.
        self._path_rng = (
            random.Random(scenario.draw_seed("path:")) if scenario.variant and scenario.live_path is not None else None
        )
        self.scheduler: SchedulerCore | None = None
        if scenario.arm == "bandmaster":
            self.scheduler = SchedulerCore(scenario.control, scenario.make_pause_policy())
            self.scheduler.apply_capacity(0.0, CapacitySnapshot(1, self.capacities))
        # Peer arms (harness/peers): the policy core picks the worker and holds turns; no KV router.
        self.peer = scenario.make_peer()
        self._peer_held: dict[str, _TurnRun] = {}
        self._peer_timers: set[float] = set()
        self._rr_next = 0
        self._queue = list(enumerate(self.programs))
        self._queue.reverse()
        self._live_programs = 0
        self._system_text = text_of_n_tokens(SYSTEM_PROMPT_TOKENS, 0)
        self._in_flight: dict[str, _TurnRun] = {}
        self._held: dict[str, _TurnRun] = {}
        self.result = RunResult(scenario.arm, scenario.parallel or scenario.programs, 0.0, 1.0)
        self._samples: dict[str, list[list]] = {w.worker_id: [] for w in self.workers}
        self._control_events: list[list] = []
        self._pending_counts: dict[str, dict[str, int]] = {w.worker_id: {} for w in self.workers}
        self._hold_s: list[float] = []
        self._soft_demotes = 0
        # For the steady-state figure: when turns and programs ended, when the last program started.
        self._turn_end_s: list[float] = []
        self._program_end_s: list[float] = []
        self._last_start_s = 0.0
        self._turn_phases: list[dict] = []

    # -- the event heap --------------------------------------------------------------------------

    def _at(self, when: float, kind: int, payload: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, kind, payload))

    def run(self) -> SimResult:
        # The engines' prefix trees are millions of small linked objects that live for the
        # whole run: with the default thresholds the cyclic collector rescans them every few
        # thousand allocations. Collect far less often while simulating (results unchanged).
        thresholds = gc.get_threshold()
        gc.set_threshold(max(thresholds[0], 200_000), max(thresholds[1], 100), max(thresholds[2], 1_000))
        try:
            return self._run()
        finally:
            gc.set_threshold(*thresholds)

    def _run(self) -> SimResult:
        started_cpu = time.process_time()
        s = self.s
        for _ in range(min(s.parallel or s.programs, len(self._queue))):
            self._start_next_program()
        if self._live_programs:
            self._at(s.sample_interval_s, _TICK)
            if self.router is not None:
                self._at(s.router_sweep_interval_s, _SWEEP)
            if self.peer is not None and self.peer.monitor_interval_s is not None:
                self._at(self.peer.monitor_interval_s, _PEER, "monitor")
        heap = self._heap
        handlers = (
            self._on_turn,
            self._on_admit,
            self._on_arrive,
            self._on_kick,
            self._on_step_end,
            self._on_deadline,
            self._on_tick,
            self._on_sweep,
            self._on_run_end,
            self._on_peer,
        )
        completed = True
        while heap:
            when, _, kind, payload = heapq.heappop(heap)
            if when > s.max_simulated_s:
                completed = False
                break
            self.now = when
            self.events += 1
            handlers[kind](payload)
        self.result.wall_s = self._makespan_s if completed else self.now
        per_worker = self._worker_counters()
        totals: dict[str, int] = {}
        for counters in per_worker.values():
            for name, value in counters.items():
                totals[name] = totals.get(name, 0) + value
        # The live runner's worker_* keys (clients/player.py COUNTERS), plus the simulator's extra ones.
        self.result.worker_counters = totals
        parallel = s.parallel or s.programs
        steady = steady_state(self._turn_end_s, self._program_end_s, self._last_start_s, parallel, s.programs)
        return SimResult(
            s,
            self.result,
            per_worker,
            self._scheduler_counters(),
            self._timeline(),
            time.process_time() - started_cpu,
            self.events,
            completed and not self._live_programs and not self._queue,
            steady,
            self.oracle_worker_kv_tokens,
            self._turn_phases,
        )

    _makespan_s = 0.0

    # -- programs (the live runner's slots) -------------------------------------------------------

    def _start_next_program(self) -> None:
        if not self._queue:
            return
        index, program = self._queue.pop()
        record = ProgramRecord(program.program_id, len(program.turns))
        self.result.programs.append(record)
        self._last_start_s = self.now
        run = _ProgramRun(
            index,
            program,
            record,
            Conversation(self._system_text, self.s.worker_page_size),
            random.Random(f"{self.s.draw_seed('')}:{program.program_id}"),
            self.now,
        )
        self._live_programs += 1
        self._on_turn(run)

    def _on_turn(self, run: _ProgramRun) -> None:
        """The client sends turn k: a new user message of the planned size (clients/player.py _play)."""
        k = run.turn
        if k >= len(run.program.turns):
            self._end_program(run)  # the tool time after the last turn has passed
            return
        program = run.program
        new_tokens = max(1, program.new_prompt_tokens(k) - (SYSTEM_PROMPT_TOKENS if k == 0 else 0))
        # The live runner's text_of_n_tokens(n, seed), as word ids (the same words).
        run.conversation.append_words("user", ids_of_n_tokens(new_tokens, run.rng.randrange(1 << 30)))
        turn = _TurnRun(f"{run.index}:{k}", run, k, self.now, program.turns[k].output_tokens)
        delay = self.s.request_overhead_s
        if self.s.live_path is not None:
            turn.estimated_tokens = run.conversation.estimated_prompt_tokens()
            turn.before_scale = self._path_scale()
            wall_s = self.s.live_path.before_admission_wall_s(turn.estimated_tokens, self.scheduler is not None)
            delay += wall_s * turn.before_scale
        turn.before_admission_s = delay
        if delay > 0:
            self._at(self.now + delay, _ADMIT, turn)
        else:
            self._on_admit(turn)

    def _path_scale(self) -> float:
        """Simulated seconds per wall second of one live-path cost: the live speedup, and with a
        `variant` other than 0, times a draw from an exponential of mean 1 (the live path's costs vary
        from turn to turn with a p90 about twice their mean, as an exponential's is 2.3x)."""
        if self._path_rng is None:
            return self.s.live_speedup
        return self.s.live_speedup * self._path_rng.expovariate(1.0)

    def _end_program(self, run: _ProgramRun) -> None:
        record = run.record
        record.duration_s = self.now - run.started_s
        record.finished = record.turns_done == record.turns_planned
        self._makespan_s = max(self._makespan_s, self.now)
        self._program_end_s.append(self.now)
        if self.scheduler is not None:
            _, effects = self.scheduler.release(self.now, program_session(run))
            self._apply(effects)
        if self.peer is not None:
            self._peer_wake(self.peer.release(self.now, program_session(run)))
        self._live_programs -= 1
        self._start_next_program()

    # -- admission and routing (the router's TurnRunner) -----------------------------------------

    def _on_admit(self, turn: _TurnRun) -> None:
        turn.admit_s = self.now
        if self.peer is not None:
            turn.prompt_ids = turn.run.conversation.prompt_ids()
            backend = self.peer.begin_turn(self.now, program_session(turn.run), len(turn.prompt_ids))
            self._arm_peer_timer()
            if backend is None:
                self._peer_held[program_session(turn.run)] = turn
            else:
                self._route(turn, None, backend)
            return
        if self.scheduler is None:
            self._route(turn, None)
            return
        result = self.scheduler.admit(
            self.now, program_session(turn.run), "", turn.run.conversation.estimated_prompt_tokens(), turn.request_id
        )
        if result.decision.verdict is Verdict.WAIT:
            self._held[turn.request_id] = turn
            deadline = self.scheduler.resume_deadline(turn.request_id)
            if deadline is not None:
                self._at(deadline, _DEADLINE, turn.request_id)
            self._apply(result.effects)
            return
        self._apply(result.effects)
        self._route(turn, result.decision)

    def _route(self, turn: _TurnRun, decision: Decision | None, backend: int | None = None) -> None:
        turn.decision = decision
        conversation = turn.run.conversation
        if backend is None:
            turn.prompt_ids = conversation.prompt_ids()
        router = self.router
        if backend is not None:
            worker = self.workers[backend]  # a peer's pick (its prompt_ids were built at admission)
        elif router is None:
            worker = self.workers[self._rr_next % len(self.workers)]
            self._rr_next += 1
        else:
            if self.s.router_prompt == "text":
                prompt = conversation.text_prompt(router.params.text_chunk_chars)
            else:
                prompt = conversation.token_prompt(turn.prompt_ids)
            pinned = None
            if decision is not None and decision.replica is not None:
                pinned = Replica(decision.replica.worker_id, decision.replica.dp_rank)
            pick = router.pick(prompt, self._candidates, self.now, pinned=pinned)
            router.commit(turn.request_id, pick, self.now)
            worker = self._by_replica[pick.replica]
            if self.scheduler is not None and decision is not None and pinned != pick.replica:
                self.scheduler.bind_request(turn.request_id, worker.key)
        turn.worker = worker.index
        turn.dispatched_s = self.now
        turn.frontend_s = worker.profile.frontend_s(len(turn.prompt_ids)) if self.s.frontend_latency else 0.0
        if self.s.live_path is not None:
            turn.dispatch_scale = self._path_scale()
            turn.dispatch_s = self.s.live_path.dispatch_wall_s(len(turn.prompt_ids)) * turn.dispatch_scale
        self._at(self.now + turn.frontend_s + turn.dispatch_s, _ARRIVE, turn)

    def _on_arrive(self, turn: _TurnRun) -> None:
        turn.arrive_s = self.now
        worker = self.workers[turn.worker]
        priority = turn.decision.priority if turn.decision is not None else None
        try:
            worker.engine.submit(
                EngineRequest(
                    turn.request_id,
                    turn.prompt_ids,
                    turn.output_tokens,
                    priority=priority,
                    ignore_eos=True,
                    prompt_pages=turn.run.conversation.page_chain(turn.prompt_ids),
                ),
                self.now,
            )
        except ValueError as exc:
            # The live simworker answers 400 (prompt longer than the context or the KV pool): the
            # turn fails, and the live runner ends the program.
            self._finish_turn(
                turn,
                RequestOutput(
                    turn.request_id,
                    (),
                    len(turn.prompt_ids),
                    0,
                    0,
                    True,
                    {"type": "abort", "message": f"rejected: {exc}"},
                ),
            )
            return
        self._in_flight[turn.request_id] = turn
        if worker.run is not None:
            # A decode run is in progress: the engine sees this request at the first step
            # boundary at or after now, exactly as when stepping one iteration at a time.
            steps = max(bisect.bisect_left(worker.run, self.now) + 1, worker.run_committed)
            if steps < worker.run_steps:
                worker.run_steps = steps
                worker.run_generation += 1
                self._at(worker.run[steps - 1], _RUN_END, (worker, worker.run_generation))
        if not worker.busy:
            # Step after everything else due now, so simultaneous arrivals share the first step.
            worker.busy = True
            self._at(self.now, _KICK, worker)

    # -- engines (the simworker driver) ----------------------------------------------------------

    def _on_kick(self, worker: _Worker) -> None:
        self._step(worker)

    def _step(self, worker: _Worker) -> None:
        engine = worker.engine
        if not engine.has_work():
            worker.busy = False
            return
        if self.s.fuse_decode:
            ends = engine.plan_decode(self.now, MAX_RUN_STEPS)
            if ends:
                worker.run, worker.run_steps = ends, len(ends)
                worker.run_generation += 1
                self._at(ends[-1], _RUN_END, (worker, worker.run_generation))
                return
        result = engine.step(self.now)
        if result.duration_s > 0:
            self._at(self.now + result.duration_s, _STEP_END, (worker, result))
        elif result.outputs:
            self._on_step_end((worker, result))
        else:
            worker.busy = False  # nothing can progress until the next submit

    def _on_step_end(self, payload: tuple[_Worker, StepResult]) -> None:
        worker, result = payload
        for output in result.outputs:
            self._deliver(output)
        self._step(worker)

    def _on_run_end(self, payload: tuple[_Worker, int]) -> None:
        worker, generation = payload
        if generation != worker.run_generation:
            return  # this run was cut short; its new end event is the live one
        if worker.run_committed < worker.run_steps:
            outputs = worker.engine.commit_decode(worker.run_steps - worker.run_committed).outputs
        else:
            outputs = worker.run_outputs
        worker.run, worker.run_committed, worker.run_outputs = None, 0, ()
        for output in outputs:
            self._deliver(output)
        self._step(worker)

    def _catch_up(self, worker: _Worker) -> None:
        """Commit the steps of a decode run that have started by now (an engine applies a step
        when it starts and reports at its end), so that gauges read now are exactly what
        stepping one iteration at a time shows. Tokens of finished steps are delivered; the
        outputs of the run's last step wait for its end."""
        run = worker.run
        if run is None:
            return
        started = min(bisect.bisect_right(run, self.now) + 1, worker.run_steps)
        if started <= worker.run_committed:
            return
        result = worker.engine.commit_decode(started - worker.run_committed)
        worker.run_committed = started
        if started < worker.run_steps:
            for output in result.outputs:
                self._deliver(output)
        else:
            worker.run_outputs = result.outputs

    def _deliver(self, output: RequestOutput) -> None:
        turn = self._in_flight.get(output.rid)
        if turn is None:
            return
        if turn.engine_admitted_s is None and output.admitted_at is not None:
            turn.engine_admitted_s = output.admitted_at
        if output.new_token_ids:
            if turn.first_token_s is None:
                turn.first_token_s = self.now
                if self.router is not None:
                    self.router.first_token(turn.request_id)
            turn.output_ids.extend(output.new_token_ids)
        if output.finished:
            del self._in_flight[output.rid]
            self._finish_turn(turn, output)

    def _finish_turn(self, turn: _TurnRun, output: RequestOutput) -> None:
        run = turn.run
        reason = (output.finish_reason or {}).get("type")
        ok = reason != "abort" and turn.first_token_s is not None
        worker = self.workers[turn.worker]
        if self.router is not None:
            self.router.finish(turn.request_id)
        if self.peer is not None:
            self._peer_wake(
                self.peer.end_turn(
                    self.now,
                    program_session(run),
                    output.prompt_tokens if ok else 0,
                    output.completion_tokens if ok else 0,
                )
            )
        if self.scheduler is not None and turn.decision is not None:
            self._apply(
                self.scheduler.complete(
                    self.now,
                    program_session(run),
                    turn.request_id,
                    worker.key,
                    output.prompt_tokens,
                    output.completion_tokens,
                    output.cached_tokens,
                    TurnOutcome.OK if ok else TurnOutcome.FAILED,
                    # The router reports dispatch -> first token of the answer (0 = unknown).
                    ttft_s=((turn.first_token_s - turn.dispatched_s) or None)
                    if turn.first_token_s is not None
                    else None,
                )
            )
        ttft_s = (turn.first_token_s if turn.first_token_s is not None else self.now) - turn.sent_s
        # The client sees the end of the answer after the relay (0 without the live path model).
        relay_s = 0.0
        if ok and self.s.live_path is not None:
            wall_s = self.s.live_path.relay_wall_s(output.prompt_tokens, output.completion_tokens)
            relay_s = wall_s * self._path_scale()
        end_s = self.now + relay_s
        self.result.turns.append(
            TurnRecord(
                run.program.program_id,
                turn.k,
                ok=ok,
                ttft_s=round(ttft_s, 4),
                turn_s=round(end_s - turn.sent_s, 4),
                prompt_tokens=output.prompt_tokens,
                cached_tokens=output.cached_tokens,
                completion_tokens=output.completion_tokens,
                error="" if ok else str((output.finish_reason or {}).get("message") or f"finish_reason={reason}")[:200],
            )
        )
        if not ok:
            run.record.errors += 1
            self._end_program(run)
            return
        run.record.turns_done += 1
        self._turn_end_s.append(end_s)
        self._record_phases(turn, relay_s)
        run.conversation.append_words("assistant", turn.output_ids)
        tool_s = run.program.turns[turn.k].tool_seconds_after
        run.turn += 1
        if tool_s + relay_s > 0:
            self._at(end_s + tool_s, _TURN, run)
        else:
            self._on_turn(run)

    def _record_phases(self, turn: _TurnRun, relay_s: float) -> None:
        """The turn's phases in simulated seconds (bench/breakdown.py's names). Before the admission
        call the model has one figure (client_send, router parsing and the admission round trip
        together, or request_overhead_s); the pick is instantaneous."""
        live = self.s.live_path
        admitted = turn.engine_admitted_s if turn.engine_admitted_s is not None else turn.arrive_s
        first = turn.first_token_s if turn.first_token_s is not None else self.now
        phases: dict = {"client_send": turn.before_admission_s}
        if live is not None:
            n, prompt = turn.estimated_tokens, len(turn.prompt_ids)
            before, dispatch = turn.before_scale, turn.dispatch_scale
            phases = {
                "client_send": self.s.request_overhead_s + live.client_send.wall_s(n) * before,
                "router_parse": live.router_parse.wall_s(n) * before,
                "admission_round_trip": (
                    live.admission_round_trip.wall_s(n) * before if self.scheduler is not None else None
                ),
                "router_to_worker": live.router_to_worker.wall_s(prompt) * dispatch,
                "worker_parse": live.worker_parse.wall_s(prompt) * dispatch,
                "relay": relay_s,
            }
        self._turn_phases.append(
            {
                **phases,
                "admission_held": turn.dispatched_s - turn.admit_s,
                "route": 0.0,
                "worker_frontend": turn.frontend_s,
                "queue": admitted - turn.arrive_s,
                "prefill": first - admitted,
                "decode": self.now - first,
                "total": self.now + relay_s - turn.sent_s,
                "prompt_tokens": len(turn.prompt_ids),
            }
        )

    # -- the scheduler's shell: ticks, timers, resolutions ---------------------------------------

    def _apply(self, effects: Effects) -> None:
        for event in effects.events:
            name = _SCHEDULER_EVENTS.get(event.kind)
            if name is None:
                continue
            if event.kind is EventKind.SOFT_DEMOTED:
                self._soft_demotes += 1
            wid = event.replica.worker_id if event.replica is not None else ""
            if name != "soft_demote":
                self._control_events.append([round(self.now, 3), name, wid, event.session_id, event.tokens])
            if wid in self._pending_counts:
                counts = self._pending_counts[wid]
                counts[name] = counts.get(name, 0) + 1
        for decision in effects.resolutions:
            turn = self._held.pop(decision.request_id, None)
            if turn is None:
                continue
            self._hold_s.append(decision.held_seconds)
            # program_gone: released while held, the live router routes it unpinned.
            self._route(turn, None if decision.program_gone else decision)

    # -- a peer arm's shell: its monitor, its timers, the turns it held ----------------------------

    def _on_peer(self, what: Any) -> None:
        assert self.peer is not None
        interval = self.peer.monitor_interval_s
        if what == "monitor":
            if interval is not None and (self._live_programs or self._queue):
                self._at(self.now + interval, _PEER, "monitor")
        else:
            self._peer_timers.discard(what)
        self._peer_wake(self.peer.tick(self.now))

    def _peer_wake(self, wakes: list[Wake]) -> None:
        take_events = getattr(self.peer, "take_events", None)
        if take_events is not None:
            # A peer's pauses, resumes and marks go to the timeline as the scheduler's do.
            for kind, program, backend, tokens in take_events():
                wid = self.workers[backend].worker_id if backend is not None else ""
                self._control_events.append([round(self.now, 3), kind, wid, program, tokens])
                if wid:
                    counts = self._pending_counts[wid]
                    counts[kind] = counts.get(kind, 0) + 1
        for wake in wakes:
            turn = self._peer_held.pop(wake.program_id, None)
            if turn is not None:
                self._hold_s.append(self.now - turn.sent_s)
                self._route(turn, None, wake.backend)
        self._arm_peer_timer()

    def _arm_peer_timer(self) -> None:
        when = self.peer.next_timer() if self.peer is not None else None
        if when is not None and when not in self._peer_timers:
            self._peer_timers.add(when)
            self._at(max(when, self.now), _PEER, when)

    def _on_deadline(self, request_id: str) -> None:
        if request_id in self._held and self.scheduler is not None:
            self._apply(self.scheduler.force_resume(self.now, request_id))

    def _on_tick(self, _: Any) -> None:
        for worker in self.workers:
            self._catch_up(worker)
        replicas = {}
        if self.scheduler is not None:
            tick = self.scheduler.tick(self.now)
            self._apply(Effects(tick.events, tick.logs, tick.resolutions))
            replicas = {r.replica: r for r in tick.replicas}
        self._sample(replicas)
        if self._live_programs or self._queue:
            self._at(self.now + self.s.sample_interval_s, _TICK)

    def _on_sweep(self, _: Any) -> None:
        if self.router is not None:
            self.router.sweep(self.now)
        if self._live_programs or self._queue:
            self._at(self.now + self.s.router_sweep_interval_s, _SWEEP)

    # -- records -----------------------------------------------------------------------------------

    def _sample(self, replicas: dict) -> None:
        t = round(self.now, 3)
        for worker in self.workers:
            stats = worker.engine.stats()
            r = replicas.get(worker.key)
            counts = self._pending_counts[worker.worker_id]
            self._samples[worker.worker_id].append(
                [
                    t,
                    round(r.utilization, 4) if r is not None else None,
                    round(r.used_decayed_tokens / r.retention_tokens, 4) if r is not None else None,
                    r.band.value if r is not None else None,
                    r.active_programs if r is not None else None,
                    r.resident_programs if r is not None else None,
                    round(stats.token_usage, 4),
                    stats.num_running_reqs,
                    stats.num_queue_reqs,
                    counts.get("pause", 0),
                    counts.get("resume", 0) + counts.get("forced_resume", 0),
                    counts.get("mark", 0),
                    counts.get("soft_demote", 0),
                ]
            )
            counts.clear()

    def _timeline(self) -> dict:
        p: ControlParams = self.s.control_law
        return {
            "interval_s": self.s.sample_interval_s,
            "bands": {
                "pause_threshold": p.pause_threshold,
                "soft_demote_threshold": p.soft_demote_threshold,
                "pause_target": min(p.pause_target, p.pause_threshold),
                "resume_ceiling": p.resume_ceiling,
            },
            "retention_tokens": {c.worker_id: c.retention_tokens for c in self.capacities},
            "columns": list(TIMELINE_COLUMNS),
            "workers": self._samples,
            "control_events_columns": ["t_s", "kind", "worker", "program", "tokens"],
            "control_events": self._control_events,
        }

    def _worker_counters(self) -> dict[str, dict[str, int]]:
        out = {}
        for worker in self.workers:
            st = worker.engine.stats()
            out[worker.worker_id] = {
                "recomputed_tokens": st.recomputed_tokens_total,
                "retractions": st.retractions_total,
                "preemptions": st.preemptions_total,
                "host_loadbacks": st.host_loadbacks_total,
                "host_loadback_tokens": st.host_loadback_tokens_total,
                "prompt_tokens": st.prompt_tokens_total,
                "cached_tokens": st.cached_tokens_total,
                "generation_tokens": st.generation_tokens_total,
                "evicted_tokens": st.evicted_tokens_total,
                "requests": st.requests_total,
                "aborted_requests": st.aborted_requests_total,
            }
        return out

    def _scheduler_counters(self) -> dict[str, float]:
        core = self.scheduler
        if self.peer is not None:
            holds = sorted(self._hold_s)
            return {
                "pauses": 0,  # the report's common columns (Continuum never pauses)
                "forced_resumes": 0,
                **self.peer.counters(),
                "held_admissions": len(holds),
                "hold_p50_s": round(holds[len(holds) // 2], 3) if holds else 0.0,
                "hold_max_s": round(holds[-1], 3) if holds else 0.0,
            }
        if core is None:
            return {}
        holds = sorted(self._hold_s)
        return {
            "pauses": core.pauses_total,
            "resumes": core.resumes_total,
            "forced_resumes": core.forced_resumes_total,
            "marks": core.marks_total,
            "soft_demotions": self._soft_demotes,
            "expired": core.expired_total,
            "released": core.released_total,
            "admissions": core.admissions_total,
            "held_admissions": len(holds),
            "hold_p50_s": round(holds[len(holds) // 2], 3) if holds else 0.0,
            "hold_max_s": round(holds[-1], 3) if holds else 0.0,
        }


def steady_state(
    turn_end_s: Sequence[float], program_end_s: Sequence[float], last_start_s: float, parallel: int, programs: int
) -> dict:
    """Throughput of a run with fewer slots than programs, without its warm-up and its drain.

    Warm-up ends when `parallel` programs have finished (every slot has started a replacement
    program at least once on average); the window closes when the last program starts (after
    that, slots empty and the run drains). `steady_steps_per_min` = turns that completed inside
    the window per minute of it. None when there is no window: every program starts at once
    (`parallel >= programs`), or the last program starts before warm-up ends."""
    none = {"steady_steps_per_min": None, "steady_window_s": None}
    if parallel >= programs or len(program_end_s) < parallel:
        return none
    ends = sorted(program_end_s)
    start, end = ends[parallel - 1], last_start_s
    if end <= start:
        return none
    turn_ends = sorted(turn_end_s)
    turns = bisect.bisect_right(turn_ends, end) - bisect.bisect_right(turn_ends, start)
    return {
        "steady_steps_per_min": round(turns / ((end - start) / 60.0), 3),
        "steady_window_s": [round(start, 3), round(end, 3)],
    }


def program_session(run: _ProgramRun) -> str:
    """The X-Dynamo-Session-ID the live runner sends: the program id."""
    return run.program.program_id


def simulate(scenario: SimScenario) -> SimResult:
    """Run one scenario to completion in virtual time."""
    return Simulator(scenario).run()
