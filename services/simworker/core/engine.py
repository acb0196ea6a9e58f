"""The simulated SGLang engine core: one scheduler iteration per `step(now)`, in virtual time.

Each step (see api.py for the driver contract):

1. **Decode memory.** Every decoding request whose tail page is full needs one new page. If free
   plus evictable pages cannot cover that, requests are *retracted* as SGLang's
   `retract_decode` does: the victim is the decoding request with the fewest generated tokens,
   ties going to the longest prompt. A victim's private tail page is freed and its references
   dropped; the full pages it computed stay in the radix cache (evictable), so its recompute
   later costs only what has been evicted meanwhile. It returns to the waiting queue at its
   original place (same arrival order / priority), and the admission reserve ratio is raised
   to SGLang's post-retraction estimate.
2. **Prefill** within `chunked_prefill_size` tokens: first continue requests whose prefill is
   in progress, then admit from the waiting queue in order (FCFS, or priority: larger value
   first unless `schedule_low_priority_values_first`), stopping at the first that does not
   fit (head-of-line, as SGLang does). Prefill and decode share the step (SGLang's mixed
   chunk / vLLM's chunked prefill), so a large prefill lengthens every decoding request's step.
   **Priority preemption** (SGLang's `preempt_to_schedule`; priority scheduling on and
   `disable_priority_preemption` off): when the running set is full (`max_running_requests`),
   decoding requests that the head of the queue beats by *more than*
   `priority_scheduling_preemption_threshold` are preempted, least important first and the most
   recent arrival first among equals, until their output reservations cover its memory demand
   (its uncached prompt plus min(remaining new tokens, 4096), less what the admission budget has
   left; at least one is needed for the slot); if that cannot be covered nobody is preempted. A
   head that is short of memory only is not a reason to preempt (SGLang ends the pass there). A
   preempted request is requeued as a retracted one is (its full pages stay cached), without
   touching the reserve ratio, and does not decode in this step.
3. **Decode** one token for every request that had finished its prefill before this step.

Admission rule (SGLang's PrefillAdder with `new_token_ratio`): a request is admitted when

    pages(uncached prompt incl. host load-back and tail) + pages(min(max_new - generated, 4096) * r)
        <= free + evictable - (its own cached pages that would stop being evictable)
           - sum over running requests of [pages(remaining prefill) + pages(min(remaining new, 4096) * r)]

where r starts at 0.7, decays linearly to 0.098 over 600 decode steps, and after a retraction
is reset to (tokens decoded + 20 per request) / (max_new_tokens) of the remaining batch. If
nothing is running, the head of the queue is admitted whenever its prompt alone fits.

Host tier: a request whose prefix continues on the host loads it back (counted as cached
tokens, `host_cached_tokens`), costing tokens * kv_bytes_per_token / host bandwidth in the
step that admits it, instead of recomputing it.

Counters: `recomputed_tokens_total` counts full pages prefilled whose chained hash this engine
had computed before (a bounded memory of hashes); partial tail pages are not counted.
`cached_tokens` of a request is its cache hit at first admission (GPU + host).

Generation is deterministic per (seed, rid): ids come from the tokenizer's word list; without
`ignore_eos` the request stops with EOS after `target_output_tokens` tokens (or a draw from a
log-normal with median 128 and sigma 1 when not given), else at `max_new_tokens` ("length").
"""

from __future__ import annotations

import bisect
import math
import random
import sys
from array import array
from collections import deque

from services.simworker.core.api import EngineConfig, EngineRequest, EngineStats, RequestOutput, StepResult
from services.simworker.core.radix import PageNode, RadixCache, path_pages
from services.simworker.core.timing import TimingProfile
from services.simworker.core.tokenizer import EOS_TOKEN_ID, NUM_WORDS_FLOAT, WORD_ID_BASE, draw_word_ids

INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = 0.7 * 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
RETRACT_DECODE_STEPS = 20
CLIP_MAX_NEW_TOKENS = 4096
HIT_RATE_WINDOW_REQUESTS = 1000
THROUGHPUT_WINDOW_S = 10.0
DEFAULT_OUTPUT_MEDIAN_TOKENS = 128

_WAITING, _PREFILL, _DECODE = 0, 1, 2
_LITTLE = sys.byteorder == "little"


class _Req:
    __slots__ = (
        "rid",
        "req",
        "order",
        "seq",
        "prompt_len",
        "kv_len",
        "last",
        "state",
        "generated",
        "target",
        "rng",
        "cached_tokens",
        "host_cached_tokens",
        "retractions",
        "admitted_once",
        "admitted_at",
        "reported",
        "reason",
        "match_data",
    )

    def __init__(self, request: EngineRequest, order: tuple, seed: int) -> None:
        self.rid = request.rid
        self.req = request
        self.order = order
        self.seq = array("I", request.input_ids)
        if not _LITTLE:
            raise RuntimeError("the page hash assumes a little-endian host")
        self.prompt_len = len(request.input_ids)
        self.kv_len = 0
        self.last: PageNode | None = None  # the deepest node of the path it holds in the cache
        self.state = _WAITING
        self.generated = 0
        self.rng = random.Random(f"{seed}:{request.rid}")
        if request.target_output_tokens is not None:
            self.target = request.target_output_tokens
        else:
            draw = self.rng.lognormvariate(math.log(DEFAULT_OUTPUT_MEDIAN_TOKENS), 1.0)
            self.target = max(1, int(draw))
        self.cached_tokens = 0
        self.host_cached_tokens = 0
        self.retractions = 0
        self.admitted_once = False
        self.admitted_at: float | None = None  # when it left the waiting queue the first time (virtual s)
        self.reported = 0  # generated tokens already given out in an output (the rest are the tail of `seq`)
        self.reason: dict | None = None
        self.match_data = b""  # the token bytes of its last prefix match while waiting (`seq` does not change then)


def _more_unreferenced(nodes: list[PageNode], limit: int) -> bool:
    """Whether more than `limit` of the pages of `nodes` are unreferenced (`ref == 0`): the same
    as `sum(n.n for n in nodes if n.ref == 0) > limit`, but it stops as soon as that is certain.
    A prefix's unreferenced pages are mostly its deepest (the shallow ones are shared), so from
    the end: a head that does not fit, re-checked every step, stops early."""
    if limit < 0:
        return True
    count = 0
    for node in reversed(nodes):
        if node.ref == 0:
            count += node.n
            if count > limit:
                return True
    return False


class SimEngine:
    """Implements the `Engine` protocol of api.py. Pure: time only enters through `now`."""

    def __init__(self, config: EngineConfig, profile: TimingProfile) -> None:
        self.config = config
        self.profile = profile
        self.page_size = config.page_size
        self.total_pages = config.max_total_tokens // config.page_size
        host_tokens = config.host_tokens() if config.enable_hierarchical_cache else 0
        self.cache = RadixCache(
            config.page_size,
            self.total_pages,
            host_tokens // config.page_size,
            config.hicache_write_policy,
            emit_events=config.emit_kv_events,
        )
        self._waiting: list[_Req] = []
        self._running: list[_Req] = []
        self._by_rid: dict[str, _Req] = {}
        self._pending: list[RequestOutput] = []
        self._arrivals = 0
        self._new_token_ratio = INIT_NEW_TOKEN_RATIO
        self._ratio_decay = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / NEW_TOKEN_RATIO_DECAY_STEPS
        self._hits: deque[tuple[int, int]] = deque()
        self._hit_prompt = 0
        self._hit_cached = 0
        self._gen_window: deque[tuple[float, float, int]] = deque()
        self._gen_window_tokens = 0
        self._gen_window_span_s = 0.0
        # counters
        self._prompt_total = 0
        self._gen_total = 0
        self._cached_total = 0
        self._host_cached_total = 0
        self._recomputed_total = 0
        self._retractions_total = 0
        self._preemptions_total = 0
        self._loadbacks_total = 0
        self._loadback_tokens_total = 0
        self._requests_total = 0
        self._aborted_total = 0

    # -- driver API ----------------------------------------------------------------------------

    def submit(self, request: EngineRequest, now: float) -> None:
        cfg = self.config
        n = len(request.input_ids)
        if request.rid in self._by_rid:
            raise ValueError(f"duplicate rid {request.rid!r}")
        if n == 0:
            raise ValueError("empty prompt")
        if n + 1 > cfg.context_length:
            raise ValueError(f"prompt of {n} tokens does not fit context_length {cfg.context_length}")
        if n + request.max_new_tokens > cfg.context_length:
            raise ValueError(
                f"prompt ({n}) + max_new_tokens ({request.max_new_tokens}) exceeds context_length {cfg.context_length}"
            )
        if -(-(n + 1) // self.page_size) > self.total_pages:
            raise ValueError(f"prompt of {n} tokens does not fit the KV pool ({cfg.max_total_tokens} tokens)")
        if request.max_new_tokens < 0:
            raise ValueError("max_new_tokens must be >= 0")
        chain = request.prompt_pages
        if chain is not None and not (len(chain.digests) == len(chain.hashes) == n // self.page_size):
            raise ValueError(f"prompt_pages must chain the prompt's {n // self.page_size} complete pages")
        try:
            r = _Req(request, self._order_key(request), cfg.seed)
        except OverflowError as exc:
            raise ValueError("token ids must be in [0, 2**32)") from exc
        self._arrivals += 1
        self._requests_total += 1
        self._by_rid[r.rid] = r
        bisect.insort(self._waiting, r, key=lambda q: q.order)

    def abort(self, rid: str, now: float) -> bool:
        r = self._by_rid.get(rid)
        if r is None:
            return False
        if r.state == _WAITING:
            self._waiting.remove(r)
        else:
            self._running.remove(r)
            self._free(r, now)
        del self._by_rid[rid]
        self._aborted_total += 1
        self._pending.append(
            self._output(r, self._take_new_ids(r), True, {"type": "abort", "message": "Abort requested"})
        )
        self._plan = None
        return True

    def flush_cache(self) -> bool:
        if self._waiting or self._running:
            return False
        self.cache.flush()
        return True

    def has_work(self) -> bool:
        return bool(self._waiting or self._running or self._pending)

    def step(self, now: float) -> StepResult:
        self._plan = None
        outputs: list[RequestOutput] = self._pending
        self._pending = []
        self._now = now
        if not self._waiting and not self._running:
            return StepResult(0.0, tuple(outputs), self.cache.drain_events())
        cache = self.cache
        page = self.page_size

        # 1. decode memory, retracting if it cannot be covered; the decode tokens' KV is placed
        #    before prefill so that prefill cannot take the pages decode needs.
        decoders = [r for r in self._running if r.state == _DECODE]
        need = sum(1 for r in decoders if r.kv_len % page == 0)
        if need > cache.available_pages:
            decoders, need = self._retract_for_decode(decoders, now, outputs)
        cache.ensure_free(need)
        context_tokens = 0
        for r in decoders:
            if r.kv_len % page == 0:
                cache.private_pages += 1
            r.kv_len += 1
            if r.kv_len % page == 0:
                cache.private_pages -= 1
                self._add_decode_page(r, r.kv_len // page - 1)
            context_tokens += r.kv_len

        # 2. prefill: continue in-progress chunks, then admit.
        budget = self.config.chunked_prefill_size
        chunks: list[tuple[int, int]] = []  # (tokens, prefix tokens in KV before the chunk)
        finished_prefill: list[_Req] = []
        for r in self._running:
            if budget <= 0:
                break
            if r.state != _PREFILL:
                continue
            done = self._prefill_chunk(r, budget, chunks)
            budget -= done
            if r.kv_len == len(r.seq):
                finished_prefill.append(r)
        load_tokens = 0
        if self._waiting and budget > 0:
            load_tokens, budget, preempted = self._admit(budget, chunks, finished_prefill, now)
            if preempted:
                # Preempted before this step's decode ran: they decode nothing in it.
                gone = set(map(id, preempted))
                decoders = [r for r in decoders if id(r) not in gone]
                context_tokens = sum(r.kv_len for r in decoders)

        # 3. sample one token for every request that was decoding at the start of the step, and
        #    the first token of every request whose prefill completed in it.
        first_tokens = 0
        sample_last = self._sample_last
        for r in decoders:
            sample_last(r)  # `_sample(r)`
            if r.state == -1:
                assert r.reason is not None  # set with the finished state
                self._finish(r, r.reason)
        for r in finished_prefill:
            if r.req.max_new_tokens == 0:
                r.state = _DECODE
                self._finish(r, {"type": "length", "length": 0})
                continue
            r.state = _DECODE
            self._sample(r)
            first_tokens += 1

        if decoders:
            self._new_token_ratio = max(MIN_NEW_TOKEN_RATIO, self._new_token_ratio - self._ratio_decay)

        duration_s = self._step_time_s(decoders, context_tokens, chunks, load_tokens)
        if duration_s == 0.0:
            duration_s = self._unstick(now, outputs)

        # Emit outputs of every request that progressed (streaming; else of those that finished or
        # have their first token), in batch order; drop finished ones from the batch.
        generated = len(decoders) + first_tokens  # one token each
        stream = self.config.stream_outputs
        still_running: list[_Req] = []
        for r in self._running:
            if r.state == -1:
                outputs.append(self._output(r, self._take_new_ids(r), True, r.reason))
                continue
            if r.generated > r.reported and (stream or not r.reported):
                outputs.append(self._output(r, self._take_new_ids(r), False, r.reason))
            still_running.append(r)
        self._running = still_running
        self._gen_total += generated
        self._record_throughput(now, duration_s, generated)
        return StepResult(duration_s, tuple(outputs), cache.drain_events())

    # -- decode runs (the offline simulator's fast path) ---------------------------------------

    def plan_decode(self, now: float, max_steps: int) -> tuple[float, ...]:
        """End times of the next steps if they are certain to be pure decode steps, or ().

        A run is planned only when the batch is all decoding and nothing waits; it stops at the
        first step in which a request finishes and before decode pages could run short (the
        point where `step` would retract). Given only `submit` calls meanwhile (they just
        queue), `commit_decode(k)` then has exactly the effect of `step` called at `now`,
        ends[0], ..., ends[k - 2], with the same floats: a driver in virtual time can advance
        many decode iterations with one event and still stop at any step boundary when a new
        request arrives. `abort` cancels the plan. Returns () unless at least 2 steps fit."""
        self._plan = None
        running = self._running
        if max_steps < 2 or self._pending or self._waiting or not running:
            return ()
        page = self.page_size
        steps = max_steps
        context = 0
        for r in running:
            if r.state != _DECODE:
                return ()
            # Decode steps until r finishes (its last token is sampled in that step).
            req = r.req
            max_new = req.max_new_tokens
            if not req.ignore_eos and r.generated < r.target <= max_new:
                left = r.target - r.generated
            else:
                left = max(1, max_new - r.generated)
            if left < steps:
                steps = left
            context += r.kv_len
        if steps < 2:
            return ()
        # Decode pages: request r takes a new page in run step j (0-based) when (kv_len + j) % page == 0.
        available = self.cache.available_pages
        need_by_residue = [0] * page
        for r in running:
            need_by_residue[(-r.kv_len) % page] += 1
        profile = self.profile
        by_utilisation = profile.decode_x == "kv_utilisation"
        pool = self.total_pages * page
        batch = len(running)
        ends: list[float] = []
        durations: list[float] = []
        t = now
        used = 0
        for j in range(steps):
            used += need_by_residue[j % page]
            if used > available:
                break
            context += batch
            ms = profile.decode_ms(context, pool) if by_utilisation else profile.decode_ms(context, 0)
            if ms <= 0.0:
                break
            duration = ms / 1000.0
            t = t + duration
            ends.append(t)
            durations.append(duration)
        if len(ends) < 2:
            return ()
        self._plan = (now, tuple(ends), tuple(durations), tuple(running))
        return self._plan[1]

    def commit_decode(self, steps: int) -> StepResult:
        """Apply the first `steps` steps of the last `plan_decode` (see there): one output per
        request carrying all its new tokens, and the steps' KV events. The rest of the plan
        stays valid, so a run can also be committed in pieces (a driver that samples the
        engine's gauges mid-run commits what has happened by then)."""
        plan = self._plan
        self._plan = None
        if plan is None or not 1 <= steps <= len(plan[1]) or tuple(self._running) != plan[3]:
            raise RuntimeError("commit_decode needs a current plan_decode of at least that many steps")
        start, ends, durations, batch = plan
        cache = self.cache
        page = self.page_size
        # Sample every request's tokens up front: each has its own generator, so the draws are
        # the ones step-by-step decoding makes, and KV placement only reads earlier positions.
        finishing: list[_Req] = []
        for r in batch:
            self._sample_run(r, steps)
            if r.state == -1:
                finishing.append(r)
        full_by_residue: list[list[_Req]] = [[] for _ in range(page)]
        alloc_by_residue = [0] * page
        for r in batch:  # r.kv_len stays the run's start until the end
            alloc_by_residue[(-r.kv_len) % page] += 1
            full_by_residue[(-r.kv_len - 1) % page].append(r)
        now = start
        ratio, decay = self._new_token_ratio, self._ratio_decay
        # `_record_throughput` of each step, inlined (the same operations in the same order).
        window = self._gen_window
        window_tokens, window_span_s = self._gen_window_tokens, self._gen_window_span_s
        tokens = len(batch)
        # The pages the steps allocate, in all. Step by step, a step evicts what it lacks: if they
        # all fit now, nothing is evicted. Else, when every decode page is a new node (none is given
        # back at its insert), the steps evict `total` less the free pages in all, and the same LRU
        # pages as one eviction before the first step (nothing else touches the evictable leaves
        # meanwhile, and evicting in parts takes the pages in the order of one call): one call.
        total = sum(alloc_by_residue) * (steps // page) + sum(alloc_by_residue[: steps % page])
        at_once = total <= cache.free_pages or (
            cache.host_pages == 0 and not cache.emit_events and self._decode_pages_are_new(batch, steps)
        )
        if at_once:
            cache.ensure_free(total)
            cache.private_pages += total
        for j in range(steps):
            need = alloc_by_residue[j % page]
            if need and not at_once:
                cache.ensure_free(need)
                cache.private_pages += need
            for r in full_by_residue[j % page]:
                cache.private_pages -= 1
                self._add_decode_page(r, (r.kv_len + j + 1) // page - 1)
            ratio = max(MIN_NEW_TOKEN_RATIO, ratio - decay)
            duration_s = durations[j]
            window.append((now + duration_s, duration_s, tokens))
            window_tokens += tokens
            window_span_s += duration_s
            horizon = now + duration_s - THROUGHPUT_WINDOW_S
            while window and window[0][0] < horizon:
                _, old_duration, old_tokens = window.popleft()
                window_tokens -= old_tokens
                window_span_s -= old_duration
            if j < steps - 1:
                now = ends[j]
        self._new_token_ratio = ratio
        self._gen_window_tokens, self._gen_window_span_s = window_tokens, window_span_s
        for r in batch:
            r.kv_len += steps
        self._now = now  # the last step's start: finished requests free then
        for r in finishing:
            self._free(r, now)
            del self._by_rid[r.rid]
        outputs = []
        stream = self.config.stream_outputs
        for r in batch:
            if stream or r.state == -1:
                outputs.append(self._output(r, self._take_new_ids(r), r.state == -1, r.reason))
        if finishing:
            self._running = [r for r in batch if r.state != -1]
        self._gen_total += steps * len(batch)
        if steps < len(ends):
            self._plan = (ends[steps - 1], ends[steps:], durations[steps:], batch)
        return StepResult(ends[steps - 1] - start, tuple(outputs), cache.drain_events())

    def _decode_pages_are_new(self, batch: tuple[_Req, ...], steps: int) -> bool:
        """Whether every page the next `steps` decode steps of `batch` fill is sure to become a new
        node: the parent of each request's first such page has no children and is no other's
        (the later pages of a request go under the node made for its first). A parent with children
        (rare: a decode page's parent is mostly the request's own last page) answers no."""
        page = self.page_size
        root = self.cache.root
        parents: set[int] = set()
        for r in batch:
            if (-r.kv_len - 1) % page >= steps:
                continue  # it fills no page in these steps
            parent = r.last if r.last is not None else root
            if parent.children or id(parent) in parents:
                return False
            parents.add(id(parent))
        return True

    def _sample_run(self, r: _Req, steps: int) -> None:
        """`steps` calls of `_sample_last` at once (the plan guarantees no finish before the last)."""
        rnd = r.rng.random
        req = r.req
        max_new = req.max_new_tokens
        generated = r.generated + steps
        r.state = _DECODE
        if req.ignore_eos or generated != r.target or r.target > max_new:
            # No EOS at the last step: `steps` words, the last one as `_sample_last` draws it.
            r.seq.extend(draw_word_ids(rnd, steps))
            r.generated = generated
            if generated >= max_new:
                r.state = -1
                r.reason = {"type": "length", "length": max_new}
            return
        r.seq.extend(draw_word_ids(rnd, steps - 1))
        r.generated = generated - 1
        self._sample_last(r)

    def _sample_last(self, r: _Req) -> None:
        """Sample one token; a request that finishes is marked (state -1, reason), not freed."""
        max_new = r.req.max_new_tokens
        r.generated += 1
        if not r.req.ignore_eos and r.generated == r.target and r.target <= max_new:
            r.seq.append(EOS_TOKEN_ID)
            r.state = -1
            r.reason = {"type": "stop", "matched": EOS_TOKEN_ID}
            return
        token = WORD_ID_BASE + math.floor(r.rng.random() * NUM_WORDS_FLOAT)  # as `draw_word_ids`
        r.seq.append(token)
        if r.generated >= max_new:
            r.state = -1
            r.reason = {"type": "length", "length": max_new}

    def stats(self) -> EngineStats:
        cache = self.cache
        page = self.page_size
        used_pages = self.total_pages - cache.available_pages
        pool_tokens = self.total_pages * page
        return EngineStats(
            num_running_reqs=len(self._running),
            num_queue_reqs=len(self._waiting),
            num_used_tokens=used_pages * page,
            token_usage=used_pages * page / pool_tokens if pool_tokens else 0.0,
            cache_hit_rate=self._hit_cached / self._hit_prompt if self._hit_prompt else 0.0,
            gen_throughput=(self._gen_window_tokens / self._gen_window_span_s if self._gen_window_span_s > 0 else 0.0),
            host_used_tokens=cache.host_used * page,
            host_total_tokens=cache.host_pages * page,
            prompt_tokens_total=self._prompt_total,
            generation_tokens_total=self._gen_total,
            cached_tokens_total=self._cached_total,
            host_cached_tokens_total=self._host_cached_total,
            recomputed_tokens_total=self._recomputed_total,
            retractions_total=self._retractions_total,
            preemptions_total=self._preemptions_total,
            host_loadbacks_total=self._loadbacks_total,
            host_loadback_tokens_total=self._loadback_tokens_total,
            evicted_tokens_total=cache.evicted_pages_total * page,
            requests_total=self._requests_total,
            aborted_requests_total=self._aborted_total,
        )

    # -- scheduling internals ------------------------------------------------------------------

    def _order_key(self, request: EngineRequest) -> tuple:
        cfg = self.config
        if not cfg.enable_priority_scheduling:
            return (0, self._arrivals)
        priority = request.priority if request.priority is not None else 0
        return (priority if cfg.schedule_low_priority_values_first else -priority, self._arrivals)

    def _reserve_pages(self, r: _Req) -> int:
        """Pages `r` may still need: rest of its prefill plus the output reservation."""
        page = self.page_size
        prefill_pages = -(-len(r.seq) // page) - (-(-r.kv_len // page))
        remaining_new = min(r.req.max_new_tokens - r.generated, CLIP_MAX_NEW_TOKENS)
        return prefill_pages + math.ceil(max(0, remaining_new) * self._new_token_ratio / page)

    def _admit(self, budget: int, chunks: list, finished_prefill: list, now: float) -> tuple[int, int, list[_Req]]:
        """Admit from the head of the waiting queue while requests fit; returns the host tokens
        loaded, the prefill budget left and the requests preempted for priority, which the caller
        drops from this step's decode."""
        cache = self.cache
        page = self.page_size
        # Σ _reserve_pages over the running batch (-1: not summed yet). It is summed only when a
        # decision needs it: a head that does not fit even without it, or a full running set
        # without preemption, ends the pass first (most steps of a busy engine with a queue).
        # Each term is what it would have been at the start: nothing in the batch changes in
        # between but what the pass itself admits or preempts, which it adds or takes off.
        reserved = -1
        load_tokens = 0
        cfg = self.config
        max_running = cfg.max_running_requests
        can_preempt = cfg.enable_priority_scheduling and not cfg.disable_priority_preemption
        preempted: list[_Req] = []
        tried: _Req | None = None
        while self._waiting and budget > 0:
            r = self._waiting[0]
            slots_full = len(self._running) >= max_running
            # SGLang tries preemption only for a full running set, once per request: without it a
            # full set ends the pass before the head's prefix is even matched (every step, when busy).
            if slots_full and (not can_preempt or r is tried):
                break
            seq_len = len(r.seq)
            # A head that does not fit is matched again every step: keep its bytes (a prompt's
            # whole sequence, ~100 KB at 25K tokens) rather than copying them each time.
            data = r.match_data if len(r.match_data) == 4 * seq_len else r.seq.tobytes()
            gpu, host = cache.match(data, (seq_len - 1) // page)
            r.match_data = data
            gpu_pages = gpu[-1].end if gpu else 0  # the path starts at the root
            uncached_pages = -(-seq_len // page) - gpu_pages
            remaining_new = min(r.req.max_new_tokens - r.generated, CLIP_MAX_NEW_TOKENS)
            out_pages = math.ceil(max(0, remaining_new) * self._new_token_ratio / page)
            need = uncached_pages + (out_pages if self._running else 0)
            if self._running and (slots_full or need <= cache.available_pages):
                if reserved < 0:
                    reserved = self._reserved_pages()
                need += reserved
            fits = (
                not slots_full
                and need <= cache.available_pages
                # Its matched pages that are evictable now stop being evictable once it holds them.
                and not (
                    need > cache.available_pages - gpu_pages and _more_unreferenced(gpu, cache.available_pages - need)
                )
            )
            if not fits:
                # A head that is only short of memory ends the pass (SGLang does not preempt for it).
                if not slots_full:
                    break
                tried = r
                demand = uncached_pages + -(-max(0, remaining_new) // page) - (cache.available_pages - reserved)
                victims = self._preemption_victims(r, demand)
                if not victims:
                    break
                for victim in victims:
                    preempted.append(victim)
                    reserved -= self._reserve_pages(victim)
                    self._requeue(victim, now)
                    self._preemptions_total += 1
                continue  # re-match: the victims' pages are evictable now
            self._waiting.pop(0)
            r.match_data = b""
            cache.lock(gpu)
            cache.lock(host)
            host_pages = path_pages(host)
            if host:
                cache.ensure_free(host_pages)
                for node in host:
                    cache.load_back(node)
                load_tokens += host_pages * page
                self._loadbacks_total += 1
                self._loadback_tokens_total += host_pages * page
            r.last = host[-1] if host else gpu[-1] if gpu else None
            r.kv_len = (gpu_pages + host_pages) * page
            if not r.admitted_once:
                r.admitted_once = True
                r.admitted_at = now
                r.cached_tokens = r.kv_len
                r.host_cached_tokens = host_pages * page
                self._record_hit(r.prompt_len, r.cached_tokens)
                self._prompt_total += r.prompt_len
                self._cached_total += r.cached_tokens
                self._host_cached_total += r.host_cached_tokens
            r.state = _PREFILL
            self._running.append(r)
            done = self._prefill_chunk(r, budget, chunks)
            budget -= done
            if r.kv_len == seq_len:
                finished_prefill.append(r)
            if reserved >= 0:
                reserved += self._reserve_pages(r)
        return load_tokens, budget, preempted

    def _reserved_pages(self) -> int:
        """Σ `_reserve_pages` over the running batch, inlined."""
        page = self.page_size
        ratio = self._new_token_ratio
        ceil = math.ceil
        reserved = 0
        for q in self._running:
            remaining_new = min(q.req.max_new_tokens - q.generated, CLIP_MAX_NEW_TOKENS)
            reserved += -(-len(q.seq) // page) - (-(-q.kv_len // page)) + ceil(max(0, remaining_new) * ratio / page)
        return reserved

    def _preemption_victims(self, r: _Req, demand_pages: int) -> list[_Req]:
        """The decoding requests SGLang's `preempt_to_schedule` would release for `r` when the
        running set is full, or [] if they cannot cover `demand_pages` (one victim
        at least, for the slot). Least important first, then the most recent arrival; only those
        `r` beats by more than the threshold; each is credited its output reservation. The caller
        asks only where preemption is on."""
        cfg = self.config
        # order[0] is the sort rank (smaller runs first), order[1] the arrival sequence.
        bound = r.order[0] + cfg.priority_scheduling_preemption_threshold
        candidates = [q for q in self._running if q.state == _DECODE and q.order[0] > bound]
        if not candidates:
            return []
        candidates.sort(key=lambda q: q.order, reverse=True)
        victims: list[_Req] = []
        for q in candidates:
            victims.append(q)
            demand_pages -= self._reserve_pages(q)
            if demand_pages <= 0:
                return victims
        return []

    def _prefill_chunk(self, r: _Req, budget: int, chunks: list) -> int:
        """Compute up to `budget` more prompt tokens of `r` (fewer if memory is short)."""
        cache = self.cache
        page = self.page_size
        old = r.kv_len
        tokens = min(len(r.seq) - old, budget)
        held = -(-old // page)
        pages = -(-(old + tokens) // page) - held
        if not cache.ensure_free(pages):
            fit_pages = cache.available_pages
            tokens = min(tokens, (held + fit_pages) * page - old)
            if tokens <= 0:
                return 0
            pages = -(-(old + tokens) // page) - held
            cache.ensure_free(pages)
        new = old + tokens
        if old % page:
            cache.private_pages -= 1
        self._add_pages(r, old // page, new // page, count_recompute=True)
        if new % page:
            cache.private_pages += 1
        r.kv_len = new
        chunks.append((tokens, old))
        return tokens

    def _add_pages(self, r: _Req, first: int, last: int, count_recompute: bool) -> None:
        """Pages first..last-1 of `r` were computed: insert them into the tree, held by `r`."""
        if first >= last:
            return
        page = self.page_size
        parent = r.last if r.last is not None else self.cache.root
        r.last, recomputed = self.cache.insert_run(
            parent, r.seq[first * page : last * page].tobytes(), r.req.prompt_pages, r.prompt_len // page
        )
        if count_recompute:
            self._recomputed_total += recomputed * page

    def _add_decode_page(self, r: _Req, index: int) -> None:
        """Page `index` of `r` was filled by decoding: into the tree, held by `r` (`_add_pages` of
        one page past its prompt's chain, by the cache's one-page path)."""
        page = self.page_size
        r.last = self.cache.insert_page(
            r.last if r.last is not None else self.cache.root, r.seq[index * page : (index + 1) * page].tobytes()
        )

    def _sample(self, r: _Req) -> None:
        self._sample_last(r)
        if r.state == -1:
            assert r.reason is not None  # _sample_last sets the reason with the finished state
            self._finish(r, r.reason)

    def _finish(self, r: _Req, reason: dict) -> None:
        r.state = -1
        r.reason = reason
        self._free(r, self._now)
        del self._by_rid[r.rid]

    def _free(self, r: _Req, now: float) -> None:
        cache = self.cache
        if r.kv_len % self.page_size:
            cache.private_pages -= 1
        if r.last is not None:
            cache.release(r.last, now)
        r.last = None
        r.kv_len = 0

    def _retract_for_decode(
        self, decoders: list[_Req], now: float, outputs: list[RequestOutput]
    ) -> tuple[list[_Req], int]:
        cache = self.cache
        page = self.page_size
        # SGLang's order: retract the request with the fewest output tokens, longest prompt first.
        candidates = sorted(decoders, key=lambda q: (q.generated, -q.prompt_len), reverse=True)
        prefilling = [r for r in self._running if r.state == _PREFILL]
        need = sum(1 for r in candidates if r.kv_len % page == 0)
        while need > cache.available_pages:
            if len(candidates) > 1:
                victim = candidates.pop()
            elif prefilling:
                victim = prefilling.pop()  # the youngest prefill holds pages a decode needs
            else:
                victim = candidates.pop()
                self._running.remove(victim)
                self._free(victim, now)
                del self._by_rid[victim.rid]
                self._aborted_total += 1
                outputs.append(
                    self._output(
                        victim,
                        self._take_new_ids(victim),
                        True,
                        {"type": "abort", "message": "KV cache pool exhausted by a single request"},
                    )
                )
                need = 0
                break
            self._retract(victim, now)
            need = sum(1 for r in candidates if r.kv_len % page == 0)
        if candidates:
            decoded = sum(r.generated for r in candidates)
            max_new = sum(r.req.max_new_tokens for r in candidates) or 1
            self._new_token_ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(candidates)) / max_new)
        kept = set(map(id, candidates))
        return [r for r in decoders if id(r) in kept], need

    def _retract(self, r: _Req, now: float) -> None:
        self._requeue(r, now)
        r.retractions += 1
        self._retractions_total += 1

    def _requeue(self, r: _Req, now: float) -> None:
        """Back to the waiting queue at its original place; its full pages stay cached."""
        self._running.remove(r)
        self._free(r, now)
        r.state = _WAITING
        bisect.insort(self._waiting, r, key=lambda q: q.order)

    def _unstick(self, now: float, outputs: list[RequestOutput]) -> float:
        """No request could progress (prefills hold the pool between them): retract the youngest
        running request so the others can finish, and charge one empty step."""
        if len(self._running) > 1:
            self._retract(self._running[-1], now)
        elif self._running:
            r = self._running[0]
            self._running.remove(r)
            self._free(r, now)
            del self._by_rid[r.rid]
            self._aborted_total += 1
            outputs.append(
                self._output(
                    r,
                    self._take_new_ids(r),
                    True,
                    {"type": "abort", "message": "KV cache pool cannot hold the request"},
                )
            )
        return self.profile.decode_ms(0, self.total_pages * self.page_size) / 1000.0

    def _step_time_s(self, decoders: list[_Req], context_tokens: int, chunks: list, load_tokens: int) -> float:
        profile = self.profile
        ms = 0.0
        if decoders or (chunks and profile.decode_on_prefill_only_steps):
            if profile.decode_x == "kv_utilisation":
                active = sum(r.kv_len for r in self._running)
                ms += profile.decode_ms(active, self.total_pages * self.page_size)
            else:
                ms += profile.decode_ms(context_tokens, 0)
        if chunks:
            ms += profile.prefill_batch_ms(sum(t for t, _ in chunks))
            for tokens, prefix in chunks:
                ms += profile.prefill_chunk_ms(tokens, prefix)
        seconds = ms / 1000.0
        if load_tokens:
            seconds += profile.host_load_s(load_tokens)
        return seconds

    # -- outputs and windows -------------------------------------------------------------------

    def _take_new_ids(self, r: _Req) -> tuple[int, ...]:
        """The tokens `r` generated since its last output (the tail of its sequence), now given out."""
        start = r.prompt_len + r.reported
        r.reported = r.generated
        return tuple(r.seq[start:]) if len(r.seq) > start else ()

    def _output(self, r: _Req, new_ids: tuple, finished: bool, reason: dict | None) -> RequestOutput:
        return RequestOutput(
            r.rid,
            new_ids,
            r.prompt_len,
            r.generated,
            r.cached_tokens,
            finished,
            reason,
            r.retractions,
            r.host_cached_tokens,
            r.admitted_at,
        )

    def _record_hit(self, prompt: int, cached: int) -> None:
        self._hits.append((prompt, cached))
        self._hit_prompt += prompt
        self._hit_cached += cached
        if len(self._hits) > HIT_RATE_WINDOW_REQUESTS:
            old_prompt, old_cached = self._hits.popleft()
            self._hit_prompt -= old_prompt
            self._hit_cached -= old_cached

    def _record_throughput(self, now: float, duration_s: float, tokens: int) -> None:
        window = self._gen_window
        window.append((now + duration_s, duration_s, tokens))
        self._gen_window_tokens += tokens
        self._gen_window_span_s += duration_s
        horizon = now + duration_s - THROUGHPUT_WINDOW_S
        while window and window[0][0] < horizon:
            _, old_duration, old_tokens = window.popleft()
            self._gen_window_tokens -= old_tokens
            self._gen_window_span_s -= old_duration

    _now = 0.0
    _plan: tuple | None = None
