"""A dependency-free progress bar for terminals and CI logs."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    """`done/total` with a bar, rate and ETA. Redraws in place on a TTY (at most ten times a second). Off a
    TTY (CI logs, `make demo | tee`) every draw is a new line, so there are few: one at each 10% step of
    the run, plus one when `log_every_s` passed without any (a slow run still shows it is alive), plus the
    last. A run of any length writes about a dozen lines, not one per update."""

    def __init__(
        self,
        total: int,
        label: str = "",
        *,
        stream: TextIO | None = None,
        width: int = 30,
        log_every_s: float = 60.0,
        clock=time.monotonic,
    ) -> None:
        self.total = max(1, total)
        self.label = label
        self.stream = stream or sys.stderr
        self.width = width
        self.log_every_s = log_every_s
        self.clock = clock
        self.done = 0
        self.extra = ""
        self._start = clock()
        self._last_draw = -1e9
        self._drawn_done = -1
        self._drawn_step = -1
        self._tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def advance(self, n: int = 1, extra: str | None = None) -> None:
        self.done = min(self.total, self.done + n)
        if extra is not None:
            self.extra = extra
        self._maybe_draw()

    def _step(self) -> int:
        return self.done * 10 // self.total  # 0..10: the 10% steps reached

    def _due(self, now: float) -> bool:
        if self.done >= self.total:
            return self._drawn_done != self.done
        if self._tty:
            return now - self._last_draw >= 0.1
        return self._step() > self._drawn_step or now - self._last_draw >= self.log_every_s

    def _maybe_draw(self, force: bool = False) -> None:
        now = self.clock()
        if not force and not self._due(now):
            return
        self._last_draw = now
        self._drawn_done = self.done
        self._drawn_step = self._step()
        self.stream.write(self.render(now) + ("\r" if self._tty and self.done < self.total else "\n"))
        self.stream.flush()

    def render(self, now: float | None = None) -> str:
        now = self.clock() if now is None else now
        elapsed = max(1e-9, now - self._start)
        frac = self.done / self.total
        filled = int(frac * self.width)
        rate = self.done / elapsed
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        eta_text = f"{eta:5.0f}s" if eta != float("inf") else "    ?"
        bar = "#" * filled + "-" * (self.width - filled)
        return (
            f"{self.label} [{bar}] {self.done}/{self.total} {frac:4.0%} {elapsed:6.1f}s eta {eta_text} {self.extra}"
        ).rstrip()

    def close(self) -> None:
        if self._drawn_done != self.done:
            self._maybe_draw(force=True)
        if self._tty and self.done < self.total:
            self.stream.write("\n")
