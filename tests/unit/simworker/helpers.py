"""Shared helpers for the simworker core tests: a virtual-time driver and an event replayer."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.common.sglang.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from services.simworker.core.api import EngineConfig, EngineRequest, RequestOutput
from services.simworker.core.engine import SimEngine
from services.simworker.profiles import load_profile


def make_engine(**config) -> SimEngine:
    config.setdefault("page_size", 4)
    config.setdefault("max_total_tokens", 256)
    return SimEngine(EngineConfig(**config), load_profile("glm45-fp8-h200"))


def prompt(n: int, base: int = 1000) -> tuple[int, ...]:
    return tuple(range(base, base + n))


@dataclass
class EventReplay:
    """Rebuilds the set of cached page hashes per medium from KV events alone."""

    gpu: set[int] = field(default_factory=set)
    host: set[int] = field(default_factory=set)

    def apply(self, events) -> None:
        for ev in events:
            if isinstance(ev, BlockStored):
                target = self.gpu if ev.medium == "GPU" else self.host
                for h in ev.block_hashes:
                    assert h not in target, f"stored twice on {ev.medium}: {h}"
                    target.add(h)
            elif isinstance(ev, BlockRemoved):
                target = self.gpu if ev.medium == "GPU" else self.host
                for h in ev.block_hashes:
                    target.remove(h)
            elif isinstance(ev, AllBlocksCleared):
                self.gpu.clear()
                self.host.clear()


@dataclass
class Run:
    engine: SimEngine
    now: float = 0.0
    outputs: dict[str, list[RequestOutput]] = field(default_factory=dict)
    finish_order: list[str] = field(default_factory=list)
    first_token_order: list[str] = field(default_factory=list)
    replay: EventReplay = field(default_factory=EventReplay)

    def submit(self, request: EngineRequest) -> None:
        self.engine.submit(request, self.now)

    def step(self) -> float:
        result = self.engine.step(self.now)
        self.now += result.duration_s
        self.replay.apply(result.kv_events)
        for out in result.outputs:
            seen = self.outputs.setdefault(out.rid, [])
            if not seen and out.new_token_ids:
                self.first_token_order.append(out.rid)
            seen.append(out)
            if out.finished:
                self.finish_order.append(out.rid)
        return result.duration_s

    def drain(self, max_steps: int = 100_000) -> None:
        for _ in range(max_steps):
            if not self.engine.has_work():
                return
            self.step()
        raise AssertionError("engine did not drain")

    def final(self, rid: str) -> RequestOutput:
        last = self.outputs[rid][-1]
        assert last.finished
        return last

    def tokens(self, rid: str) -> list[int]:
        return [t for out in self.outputs[rid] for t in out.new_token_ids]


def assert_no_leak(engine: SimEngine) -> None:
    """After everything finished: no private pages, nothing referenced, counts consistent."""
    cache = engine.cache
    assert cache.private_pages == 0
    assert cache.evictable_pages == cache.gpu_pages
    assert cache.free_pages + cache.gpu_pages == cache.total_pages
    gpu, host = cache.cached_hashes()
    assert len(gpu) == cache.gpu_pages
    assert len(host) == cache.host_used
    assert cache.host_used <= cache.host_pages
    stack = list(cache.root.children.values())
    while stack:
        node = stack.pop()
        assert node.ref == 0
        assert node.on_gpu or node.on_host
        if node.on_gpu:
            assert node.parent is cache.root or node.parent.on_gpu
        stack.extend(node.children.values())
