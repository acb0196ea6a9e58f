"""A tiny scripted engine for the HTTP tests while the real SimEngine is not there. Test-only."""

from __future__ import annotations

from services.simworker.core.api import EngineRequest, EngineStats, RequestOutput, StepResult, BlockStored
from services.simworker.core import tokenizer


class ScriptedEngine:
    def __init__(self, page_size: int = 16) -> None:
        self.page = page_size
        self.waiting: list[EngineRequest] = []
        self.running: dict[str, list] = {}
        self.seen: list[tuple[int, ...]] = []
        self.aborted: set[str] = set()
        self.requests_total = 0

    def submit(self, request, now):
        self.waiting.append(request)

    def abort(self, rid, now):
        if rid in self.running or any(r.rid == rid for r in self.waiting):
            self.aborted.add(rid)
            return True
        return False

    def has_work(self):
        return bool(self.waiting or self.running)

    def flush_cache(self):
        if self.has_work():
            return False
        self.seen.clear()
        return True

    def stats(self):
        return EngineStats(num_running_reqs=len(self.running), num_queue_reqs=len(self.waiting),
                           requests_total=self.requests_total)

    def step(self, now):
        outputs, events = [], []
        for r in self.waiting:
            best = 0
            for p in self.seen:
                n = 0
                while n < min(len(p), len(r.input_ids)) and p[n] == r.input_ids[n]:
                    n += 1
                best = max(best, n // self.page * self.page)
            self.seen.append(r.input_ids)
            target = r.max_new_tokens if r.ignore_eos else min(r.max_new_tokens, r.target_output_tokens or 8)
            self.running[r.rid] = [r, 0, best, target]
            events.append(BlockStored((len(self.seen),), None, r.input_ids[: self.page], self.page))
        self.waiting.clear()
        for rid, st in list(self.running.items()):
            r, done, cached, target = st
            if rid in self.aborted:
                self.aborted.discard(rid)
                del self.running[rid]
                outputs.append(RequestOutput(rid, (), len(r.input_ids), done, cached, True,
                                             {"type": "abort", "message": "aborted"}))
                continue
            done += 1
            st[1] = done
            finished = done >= target
            tok = tokenizer.EOS_TOKEN_ID if finished and not r.ignore_eos and target < r.max_new_tokens else 256 + done
            reason = None
            if finished:
                reason = {"type": "length", "length": done} if tok != tokenizer.EOS_TOKEN_ID else {"type": "stop", "matched": tok}
                del self.running[rid]
                self.requests_total += 1
            outputs.append(RequestOutput(rid, (tok,), len(r.input_ids), done, cached, finished, reason))
        return StepResult(0.001, tuple(outputs), tuple(events))
