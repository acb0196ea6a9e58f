"""Read a worker timing profile file (the simworker's JSON format) for the core's `EngineProfile.from_fields`.

A name (e.g. "glm45-fp8-h200") resolves to the profile shipped with the simworker package as a
data file (read as data, no simworker code is imported); anything else is a path. A real
deployment passes its own file with the same fields.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from services.common.settings.errors import ConfigError
from services.planner.core.throughput import EngineProfile


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
    return EngineProfile.from_fields(
        raw, name_or_path, max_running_requests=max_running_requests, kv_capacity_tokens=kv_capacity_tokens
    )
