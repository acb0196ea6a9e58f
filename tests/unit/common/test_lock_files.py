"""The lock files pin every dependency pyproject.toml names (versions that satisfy it, with hashes), the
image's lock agrees with the development lock, and every install path installs from a lock."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[3]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)\s*\\?$")


def pins(path: Path) -> dict[str, tuple[str, int]]:
    """name -> (version, number of hashes) for every pin in a pip-compile lock file."""
    found: dict[str, tuple[str, int]] = {}
    current = None
    for line in path.read_text().splitlines():
        match = PIN.match(line)
        if match:
            current = canonicalize_name(match.group(1))
            found[current] = (match.group(2), 0)
        elif current and line.strip().startswith("--hash=sha256:"):
            version, hashes = found[current]
            found[current] = (version, hashes + 1)
    return found


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def check_pinned(requirements: list[str], locked: dict[str, tuple[str, int]]) -> None:
    for text in requirements:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        assert name in locked, f"{req.name} (pyproject.toml) is not in the lock: run `make lock`"
        version, hashes = locked[name]
        assert req.specifier.contains(version, prereleases=True), (
            f"{req.name}=={version} in the lock does not satisfy {req.specifier}: run `make lock`"
        )
        assert hashes >= 1, f"{req.name} has no hash in the lock"


def test_every_dependency_is_pinned_with_hashes_in_the_lock():
    meta = project()
    locked = pins(ROOT / "requirements.lock")
    extras = meta["optional-dependencies"]
    check_pinned(meta["dependencies"] + extras["dev"] + extras["kubernetes"], locked)
    assert all(hashes >= 1 for _, hashes in locked.values())


def test_the_image_lock_pins_the_services_dependencies_at_the_development_versions():
    dev = pins(ROOT / "requirements.lock")
    runtime = pins(ROOT / "requirements-runtime.lock")
    # The image runs every connector of the planner: the runtime lock carries the kubernetes extra.
    check_pinned(project()["dependencies"] + project()["optional-dependencies"]["kubernetes"], runtime)
    differ = {
        name: (version, dev.get(name, ("missing",))[0])
        for name, (version, _) in runtime.items()
        if dev.get(name, ("",))[0] != version
    }
    assert not differ, f"requirements-runtime.lock and requirements.lock disagree: {differ}; run `make lock`"


def test_every_install_path_installs_from_a_lock_with_hashes():
    makefile = (ROOT / "Makefile").read_text()
    assert "pip install --quiet --require-hashes -r requirements.lock" in makefile
    assert "$(STAMP): pyproject.toml requirements.lock" in makefile
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "pip install --require-hashes -r requirements-runtime.lock" in dockerfile
    assert "make test" in (ROOT / ".ci" / "run").read_text()
