"""clients/progress.py: in place on a terminal; off one (CI logs), a line per 10% step and a heartbeat."""

from __future__ import annotations

import io

from clients.progress import ProgressBar


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_tty_a_long_run_writes_a_line_per_10_percent_step():
    stream, clock = io.StringIO(), Clock()
    bar = ProgressBar(1000, "turns", stream=stream, clock=clock, log_every_s=1e9)
    for _ in range(1000):
        clock.t += 0.5
        bar.advance()
    bar.close()
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    # The first update (0%), then 10%, 20%, ... 100%: eleven lines for a thousand updates.
    assert len(lines) == 11, lines
    assert [line.split()[3] for line in lines] == [f"{p}%" for p in range(0, 101, 10)]
    assert lines[-1].startswith("turns [" + "#" * 30 + "] 1000/1000")


def test_off_a_tty_a_slow_run_shows_it_is_alive_every_log_every_s():
    stream, clock = io.StringIO(), Clock()
    bar = ProgressBar(1000, "turns", stream=stream, clock=clock, log_every_s=60.0)
    for _ in range(50):  # 5% in 500 s: no new step, a heartbeat each minute
        clock.t += 10.0
        bar.advance()
    assert len(stream.getvalue().splitlines()) == 1 + 500 // 60


def test_on_a_tty_it_redraws_in_place_and_ends_with_one_newline():
    stream, clock = Tty(), Clock()
    bar = ProgressBar(100, "turns", stream=stream, clock=clock)
    for _ in range(100):
        clock.t += 0.05
        bar.advance()
    bar.close()
    text = stream.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n") and "100/100 100%" in text.rsplit("\r", 1)[1]
    assert 30 <= text.count("\r") <= 60  # at most ten draws a second over five seconds, not one per update


def test_the_last_line_is_written_once_whatever_close_and_extra_advances_do():
    stream, clock = io.StringIO(), Clock()
    bar = ProgressBar(3, stream=stream, clock=clock)
    for _ in range(5):
        bar.advance()
    bar.close()
    assert sum("3/3" in line for line in stream.getvalue().splitlines()) == 1
