"""Image references in the deployment files: what counts as pinned, and the tag Bandmaster's image carries."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def package_version() -> str:
    """The version in pyproject.toml: the tag of Bandmaster's own image everywhere it is named."""
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def image_is_pinned(image: str) -> bool:
    """A reference with a digest, or with an explicit tag other than `latest` (the tag follows the last
    `/`, so a registry's `host:port` is no tag)."""
    if re.search(r"@sha256:[0-9a-f]{64}$", image):
        return True
    name, _, tag = image.rpartition("/")[2].partition(":")
    return bool(name) and re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag) is not None and tag != "latest"
