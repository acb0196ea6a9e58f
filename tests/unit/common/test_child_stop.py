"""services/common/process/child_stop.py: stopping a child never waits without a bound, frozen or deaf children
included."""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor

import pytest

from services.common.process.child_stop import stop_child, stop_child_async
from services.common.settings.errors import ConfigError

DEAF = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
SLEEPER = "import time; print('ready', flush=True); time.sleep(60)"


def _start(code: str) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert process.stdout is not None and process.stdout.readline().strip() == b"ready"
    return process


def test_a_frozen_child_stops_on_sigterm_within_the_grace():
    process = _start(SLEEPER)
    os.kill(process.pid, signal.SIGSTOP)
    assert stop_child(process, grace_s=5.0)
    assert process.returncode == -signal.SIGTERM  # continued, then acted on SIGTERM: not killed


def test_a_child_deaf_to_sigterm_is_killed_after_the_grace():
    process = _start(DEAF)
    assert stop_child(process, grace_s=0.3)
    assert process.returncode == -signal.SIGKILL


def test_nothing_to_do_for_none_or_a_finished_child():
    assert stop_child(None)
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    assert stop_child(process)


def test_the_async_variant_kills_a_deaf_child():
    async def run() -> int | None:
        process = await asyncio.create_subprocess_exec(sys.executable, "-c", DEAF, stdout=asyncio.subprocess.PIPE)
        assert process.stdout is not None and (await process.stdout.readline()).strip() == b"ready"
        assert await stop_child_async(process, grace_s=0.3)
        return process.returncode

    assert asyncio.run(run()) == -signal.SIGKILL


def _refuse(_: int) -> None:
    raise ConfigError("pause_threshold", 1.5, "0 <= pause_threshold <= 1")


def test_config_error_survives_pickling_with_its_parts():
    error = pickle.loads(pickle.dumps(ConfigError("pause_threshold", 1.5, "0 <= pause_threshold <= 1")))
    assert (error.field, error.value, error.reason) == ("pause_threshold", 1.5, "0 <= pause_threshold <= 1")
    assert str(error) == "invalid configuration: pause_threshold=1.5: 0 <= pause_threshold <= 1"


def test_config_error_raised_in_a_process_pool_reaches_the_parent():
    with ProcessPoolExecutor(max_workers=1) as pool:
        with pytest.raises(ConfigError) as caught:
            pool.submit(_refuse, 0).result(timeout=60)
    assert caught.value.field == "pause_threshold"


# A service's graceful stop: on SIGTERM it gives the handler back (as serve_until_signal does), then takes
# a while to flush. A second SIGTERM in that window would end it at once, with its flush undone.
GRACEFUL = (
    "import signal, sys, time\n"
    "def stop(*_):\n"
    "    signal.signal(signal.SIGTERM, signal.SIG_DFL)\n"
    "    time.sleep(0.5)\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, stop)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def test_an_already_signalled_child_is_not_sent_sigterm_again():
    process = _start(GRACEFUL)
    process.send_signal(signal.SIGTERM)
    assert stop_child(process, grace_s=5.0, signalled=True)
    assert process.returncode == 0  # its graceful stop ran to the end


def test_supervisor_stop_all_lets_every_child_finish_its_graceful_stop(tmp_path):
    from services.launcher.supervisor import ChildSpec, Supervisor

    supervisor = Supervisor(tmp_path)
    child = supervisor.start(ChildSpec("graceful", "unused", []))
    child.process.kill()  # replaced by a bare graceful child, to watch how stop_all signals it
    child.process.wait()
    child.process = _start(GRACEFUL)
    supervisor.stop_all(grace_s=5.0)
    assert child.process.returncode == 0
