"""Suite-wide hooks.

A failed test's processes: each process the test started (tests/support/processes) has its log tail
added to the failure report, so that a failure in CI, where the temporary directory is gone, still
says what the services logged.

Tests that instrument the scheduler core by replacing its methods run on the pure core.

A compiled class (the scheduler core built by scripts/compile_core.py) has no per-instance methods to
replace and no deep copy, so a test marked `pure_core` is skipped when the compiled core runs and is
run by the pure-core pass (`make test` runs `BANDMASTER_PURE_CORE=1 pytest -m pure_core` after the
suite). tests/unit/scheduler/test_compiled_core.py holds the two cores to the same decisions.
"""

from __future__ import annotations

import pytest

from services.scheduler.core import compiled
from tests.support import processes

LOG_TAIL_LINES = 80
_FIRST_PROCESS = pytest.StashKey[int]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_FIRST_PROCESS] = processes.started_count()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if not report.failed or _FIRST_PROCESS not in item.stash:
        return
    first = item.stash[_FIRST_PROCESS]
    del item.stash[_FIRST_PROCESS]  # the first failing phase reports them, once
    for proc in processes.started_since(first):
        report.sections.append((f"log of {proc.name} ({proc.log_path})", proc.log_tail(LOG_TAIL_LINES)))


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
