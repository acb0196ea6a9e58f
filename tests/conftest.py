"""Suite-wide: tests that instrument the scheduler core by replacing its methods run on the pure core.

A compiled class (the scheduler core built by scripts/compile_core.py) has no per-instance methods to
replace and no deep copy, so a test marked `pure_core` is skipped when the compiled core runs and is
run by the pure-core pass (`make test` runs `BANDMASTER_PURE_CORE=1 pytest -m pure_core` after the
suite). tests/unit/scheduler/test_compiled_core.py holds the two cores to the same decisions.
"""

from __future__ import annotations

import pytest

from services.scheduler.core import compiled


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not compiled():
        return
    skip = pytest.mark.skip(
        reason="replaces the scheduler core's methods: runs in the pure-core pass "
        "(BANDMASTER_PURE_CORE=1 pytest -m pure_core; make test runs it)"
    )
    for item in items:
        if item.get_closest_marker("pure_core") is not None:
            item.add_marker(skip)
