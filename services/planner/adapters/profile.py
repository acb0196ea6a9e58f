"""Load a worker timing profile file (the simworker's JSON format) into the core's EngineProfile.

A name (e.g. "glm45-fp8-h200") resolves to the profile shipped with the simworker package as a
data file (read as data, no simworker code is imported); anything else is a path. A real
deployment passes its own file with the same fields.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from services.common.errors import ConfigError
from services.planner.core.throughput import EngineProfile

_FIELDS = (
    "decode_x",
    "decode_e0_ms",
    "decode_e1_ms",
    "decode_e2_ms",
    "decode_x_knee",
    "decode_min_ms",
    "prefill_step_base_ms",
    "prefill_ms_per_token",
    "prefill_attn_ms_per_token2",
    "kv_capacity_tokens",
)


def load_engine_profile(
    name_or_path: str, *, max_running_requests: int = 256, kv_capacity_tokens: int = 0
) -> EngineProfile:
    path = Path(name_or_path)
    try:
        if path.suffix == ".json" or path.exists():
            text = path.read_text()
        else:
            text = (resources.files("services.simworker.core") / "profiles" / f"{name_or_path}.json").read_text()
    except (OSError, ModuleNotFoundError) as exc:
        raise ConfigError("timing_profile", name_or_path, f"cannot read the profile: {exc}") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError("timing_profile", name_or_path, f"invalid JSON: {exc.msg}") from None
    missing = [f for f in _FIELDS if f not in raw]
    if missing:
        raise ConfigError("timing_profile", name_or_path, f"missing fields: {', '.join(missing)}")
    if raw["decode_x"] not in ("context_k", "kv_utilisation"):
        raise ConfigError("timing_profile", name_or_path, "decode_x must be context_k or kv_utilisation")
    try:
        return EngineProfile(
            name=str(raw.get("name", name_or_path)),
            decode_x=raw["decode_x"],
            **{f: float(raw[f]) for f in _FIELDS[1:-1]},
            kv_capacity_tokens=int(kv_capacity_tokens or raw["kv_capacity_tokens"]),
            max_running_requests=max_running_requests,
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError("timing_profile", name_or_path, f"bad field value: {exc}") from None
