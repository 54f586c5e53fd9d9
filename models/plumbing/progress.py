"""Progress of work that takes more than a few seconds, for every entry point: a tqdm bar on a terminal,
else (a log, a pipe) a plain line on stderr once the stage has run ``FIRST_LINE`` seconds and then at
least every ``EVERY`` seconds, naming the stage, the work done of the total, the time elapsed and an
estimate of the time left, and a last line when such a stage ends::

    with Progress("per-head ablation and patching", total=288, unit="runs") as bar:
        for batch in batches:
            ...
            bar.advance(len(batch))

    progress: per-head ablation and patching 120/288 runs, 1 min 2 s elapsed, about 1 min 27 s left
"""

from __future__ import annotations

import sys
import threading
import time

from tqdm.auto import tqdm

FIRST_LINE = 5.0  # seconds: a stage that ends sooner prints nothing off a terminal
EVERY = 30.0  # seconds between plain lines at most


def duration(seconds: float) -> str:
    """``75.3`` -> ``1 min 15 s``; ``3725`` -> ``1 h 2 min``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


class Progress:
    """One stage's progress (module docstring). ``advance(n)`` after each piece of work, ``n`` in the
    stage's unit (pieces of unequal cost advance by their cost, so that the estimate stays honest).
    Off a terminal a daemon thread checks every second whether a line is due, so that lines come while one
    long piece of work runs (``ticking=False``: only ``advance`` and ``tick`` print). ``stream`` (default
    stderr) and ``clock`` are for tests; ``terminal`` None: whether ``stream`` is one."""

    def __init__(self, stage: str, total: float, unit: str = "it", stream=None, clock=time.monotonic,
                 terminal: bool | None = None, ticking: bool = True):  # fmt: skip
        self.stage, self.total, self.unit, self.clock = stage, total, unit, clock
        self._lock = threading.RLock()
        self.stream = sys.stderr if stream is None else stream
        if terminal is None:
            terminal = bool(getattr(self.stream, "isatty", lambda: False)())
        self.bar = tqdm(total=total, desc=stage, unit=unit, leave=False, file=self.stream) if terminal else None
        self.done, self.start, self.printed = 0.0, clock(), None
        self._stop = threading.Event()
        self._ticker = None
        if self.bar is None and ticking:  # a line is due even while one long piece of work runs
            self._ticker = threading.Thread(target=self._tick_until_closed, daemon=True)
            self._ticker.start()

    def _tick_until_closed(self) -> None:
        while not self._stop.wait(1.0):
            self.tick()

    def tick(self) -> None:
        """Print the plain line if one is due (``FIRST_LINE`` into the stage, then every ``EVERY`` s)."""
        now = self.clock()
        due = self.start + FIRST_LINE if self.printed is None else self.printed + EVERY
        if now >= due and self.done < self.total:
            self._line(now)

    def advance(self, n: float = 1) -> None:
        with self._lock:
            self.done += n
        if self.bar is not None:
            self.bar.update(n)
        else:
            self.tick()

    def line(self, now: float | None = None) -> str:
        """The plain line for the work done so far."""
        now = self.clock() if now is None else now
        elapsed = now - self.start
        left = elapsed / self.done * (self.total - self.done) if self.done > 0 else None
        estimate = "estimating the time left" if left is None else f"about {duration(left)} left"
        return (f"progress: {self.stage} {_count(self.done)}/{_count(self.total)} {self.unit}, "
                f"{duration(elapsed)} elapsed, {estimate}")  # fmt: skip

    def _line(self, now: float) -> None:
        with self._lock:
            if self.printed is not None and now < self.printed + EVERY:
                return  # the ticker and the caller both found it due
            print(self.line(now), file=self.stream, flush=True)
            self.printed = now

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        if self.bar is not None:
            self.bar.close()
        elif self.printed is not None:  # a stage that printed says when it ended
            elapsed = duration(self.clock() - self.start)
            print(f"progress: {self.stage} done, {_count(self.done)} {self.unit} in {elapsed}", file=self.stream,
                  flush=True)  # fmt: skip

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _count(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.1f}"

