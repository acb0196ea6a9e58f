"""Timing profile files: the shell side of core/timing.py (which turns the fields read here into a profile).

    load_profile("glm45-fp8-h200")                  # a profile shipped in services/simworker/core/profiles/
    load_profile("mine.toml", {"decode_e0_ms": 20})  # a user file (JSON or TOML), then overrides
    builtin_profiles()                               # the shipped names

A user file may name ``"base": "<shipped profile>"`` and override some of its fields; its name is the
file's stem unless it gives one.
"""

from __future__ import annotations

import json
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from services.common.settings.errors import ConfigError
from services.simworker.core.timing import DEFAULT_PROFILE, TimingProfile, profile_from_fields

_PACKAGED = ("services.simworker.core", "profiles")


def builtin_profiles() -> list[str]:
    folder = resources.files(_PACKAGED[0]) / _PACKAGED[1]
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


def _read_builtin(name: str) -> dict[str, Any]:
    path = resources.files(_PACKAGED[0]) / _PACKAGED[1] / f"{name}.json"
    if not path.is_file():
        raise ConfigError("profile", name, f"unknown profile; known: {builtin_profiles()} or a .json/.toml path")
    return json.loads(path.read_text(encoding="utf-8"))


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (OSError, ValueError) as exc:
        raise ConfigError("profile", str(path), f"unreadable profile file: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError("profile", str(path), "a profile file holds one object")
    return data


def load_profile(
    name_or_path: str | Path = DEFAULT_PROFILE, overrides: Mapping[str, Any] | None = None
) -> TimingProfile:
    """A shipped profile by name, or a JSON/TOML file (optionally ``"base": <name>``), plus overrides."""
    text = str(name_or_path)
    path = Path(text)
    if text.endswith((".json", ".toml")) or path.is_file():
        if not path.is_file():
            raise ConfigError("profile", text, "profile file does not exist")
        data = _read_file(path)
        base = data.pop("base", None)
        data.setdefault("name", path.stem)  # a derived file is its own profile, not its base
        if base is not None:
            data = {**_read_builtin(str(base)), **data}
    else:
        data = _read_builtin(text)
    return profile_from_fields(data, overrides, label=text)
