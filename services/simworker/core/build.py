"""A simworker's engine and the HiCache host pool it reports, from the engine's own sizes.

The server (services/simworker/server.py) maps its flags onto an `EngineConfig` (SGLang's GB units
converted with the timing profile's kv_bytes_per_token) and builds through here; the offline simulator
(harness/simlib) builds its workers through here from an `EngineConfig` it makes itself, so both run
the same engine with the same host pool.

    profile = load_profile("glm45-fp8-h200")          # services/simworker/profiles.py (the file is read there)
    engine = build_engine(EngineConfig(max_total_tokens=131_072, emit_kv_events=False), profile)
    host_total_tokens(config)   # what /server_info reports as hicache_host_total_tokens
"""

from __future__ import annotations

from services.simworker.core.api import Engine, EngineConfig
from services.simworker.core.engine import SimEngine
from services.simworker.core.timing import TimingProfile

DEFAULT_MODEL_PATH = "bandmaster/simworker"
"""The model path, and served model name, a simworker reports unless told otherwise (nothing is loaded)."""


def build_engine(config: EngineConfig, profile: TimingProfile) -> Engine:
    """The real engine (SimEngine) with `config`'s sizes and `profile`'s timing."""
    return SimEngine(config, profile)


def host_total_tokens(config: EngineConfig) -> int:
    """HiCache host pool in tokens: 0 without HiCache, else hicache_size_tokens if given, else
    hicache_ratio x the GPU pool (SGLang's rule)."""
    return config.host_tokens() if config.enable_hierarchical_cache else 0
