"""TransitionLog: a flapping worker writes a bounded number of lines, and the last line is its real state."""

import logging

from services.capacity.core.registry import Transition, TransitionKind
from services.capacity.transition_log import TransitionLog

LOG = logging.getLogger("test.capacity.transitions")


def health(wid, old, new):
    return Transition(TransitionKind.HEALTH, wid, old, new)


def lines(caplog):
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOG.name]


def test_flapping_is_logged_once_per_interval_and_ends_on_the_real_state(caplog):
    caplog.set_level(logging.DEBUG, logger=LOG.name)
    tlog = TransitionLog(LOG, interval_s=60)
    now = 0.0
    for i in range(30):  # a flip every second for 30 s
        old, new = ("HEALTHY", "UNHEALTHY") if i % 2 == 0 else ("UNHEALTHY", "HEALTHY")
        tlog.emit([health("w", old, new)], now)
        tlog.flush(now)
        now += 1
    assert lines(caplog) == [
        (logging.WARNING, "worker w health: HEALTHY -> UNHEALTHY"),
        (logging.INFO, "worker w health: UNHEALTHY -> HEALTHY"),
    ]
    assert tlog.suppressed_total == 28
    tlog.flush(now + 60)
    assert lines(caplog)[2:] == [
        (
            logging.WARNING,
            "worker w health: HEALTHY -> UNHEALTHY (latest of 14 health transitions not logged in the last 60s)",
        ),
        (
            logging.INFO,
            "worker w health: UNHEALTHY -> HEALTHY (latest of 14 health transitions not logged in the last 60s)",
        ),
    ]
    tlog.flush(now + 200)
    assert len(lines(caplog)) == 4  # nothing more to say


def test_kinds_and_workers_are_limited_separately_and_lifecycle_never(caplog):
    caplog.set_level(logging.DEBUG, logger=LOG.name)
    tlog = TransitionLog(LOG, interval_s=60)
    tlog.emit(
        [
            Transition(TransitionKind.ADDED, "w", "absent", "PENDING"),
            health("w", "PENDING", "HEALTHY"),
            health("v", "PENDING", "HEALTHY"),
            Transition(TransitionKind.CARD_CHANGED, "w", "a", "b"),
            Transition(TransitionKind.CARD_HELD, "w", "a", "b"),
            Transition(TransitionKind.CARD_HELD, "w", "a", "b"),
            health("w", "HEALTHY", "UNHEALTHY"),
            health("w", "UNHEALTHY", "HEALTHY"),
            health("w", "HEALTHY", "UNHEALTHY"),
        ],
        0.0,
    )
    assert [m for _, m in lines(caplog)] == [
        "worker w added: absent -> PENDING",
        "worker w health: PENDING -> HEALTHY",
        "worker v health: PENDING -> HEALTHY",
        "worker w card_changed: a -> b",
        "worker w card_held: a -> b",
        "worker w card_held: a -> b",
        "worker w health: HEALTHY -> UNHEALTHY",
    ]
    # Removal writes what was held back first, then the removal.
    tlog.emit([Transition(TransitionKind.REMOVED, "w", "UNHEALTHY", "absent")], 1.0)
    assert [m for _, m in lines(caplog)][-3:] == [
        "worker w health: UNHEALTHY -> HEALTHY (latest of 1 health transitions not logged in the last 60s)",
        "worker w health: HEALTHY -> UNHEALTHY (latest of 1 health transitions not logged in the last 60s)",
        "worker w removed: UNHEALTHY -> absent",
    ]


def test_interval_zero_logs_everything(caplog):
    caplog.set_level(logging.DEBUG, logger=LOG.name)
    tlog = TransitionLog(LOG, interval_s=0)
    for _ in range(5):
        tlog.emit([health("w", "HEALTHY", "UNHEALTHY")], 0.0)
    assert len(lines(caplog)) == 5 and tlog.suppressed_total == 0


def test_the_last_summary_is_the_latest_state_even_when_windows_expire_apart(caplog):
    caplog.set_level(logging.DEBUG, logger=LOG.name)
    tlog = TransitionLog(LOG, interval_s=60)
    tlog.emit([health("w", "HEALTHY", "UNHEALTHY")], 0.0)  # opens the -> UNHEALTHY window
    tlog.emit([health("w", "UNHEALTHY", "HEALTHY")], 30.0)  # opens the -> HEALTHY window
    tlog.emit([health("w", "HEALTHY", "UNHEALTHY")], 40.0)  # held
    tlog.emit([health("w", "UNHEALTHY", "HEALTHY")], 50.0)  # held: the real state is HEALTHY
    tlog.flush(61.0)  # only the first window has run out
    assert [m for _, m in lines(caplog)][-1].startswith("worker w health: UNHEALTHY -> HEALTHY (latest of 1")


def test_a_degradation_is_a_warning_and_its_end_is_info(caplog):
    caplog.set_level(logging.DEBUG, logger=LOG.name)
    tlog = TransitionLog(LOG, interval_s=60)
    tlog.emit([Transition(TransitionKind.DEGRADED, "w", "none", "cache_report_off", "add --enable-cache-report")], 0)
    tlog.emit([Transition(TransitionKind.DEGRADED, "v", "cache_report_off", "none")], 0)
    assert lines(caplog) == [
        (logging.WARNING, "worker w degraded: none -> cache_report_off (add --enable-cache-report)"),
        (logging.INFO, "worker v degraded: cache_report_off -> none"),
    ]
