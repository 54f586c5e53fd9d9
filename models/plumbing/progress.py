"""Progress of long work, the one way every loop of the suite shows it (``progress``): a tqdm bar on a
terminal; otherwise (stderr a file: ``nohup``, a Slurm log, a pipe) a plain line every ``INTERVAL`` seconds,

    train: 1200/5000 (24%), 0:01:30 elapsed, about 0:04:45 left (gap=0.0123)

and a last one when the loop ends, if any was printed. A loop shorter than ``INTERVAL`` prints nothing off a
terminal, so a short run's log holds only its results. The line comes from a timer, not from the loop, so
it comes even while one step of the loop takes longer than ``INTERVAL``."""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections.abc import Iterable

INTERVAL = 30.0  # seconds between two plain lines off a terminal
INTERVAL_ENV = "CAUSAL_ICL_PROGRESS_S"  # an environment variable that sets another interval (seconds)

_WRITING = threading.Lock()  # the plain progress lines of every bar in this process


def progress(iterable: Iterable | None = None, desc: str = "", total: int | None = None, enabled: bool = True,
             interval: float | None = None, **tqdm_kw):  # fmt: skip
    """``iterable`` wrapped to show progress (or, with ``iterable`` None, a counter to ``update()`` by hand up
    to ``total``), as tqdm's API: iterate it, ``update(n)``, ``set_postfix(**kw)``, ``close()``, or use it as
    a context manager (with neither ``iterable`` nor ``total``, a run of stages that ``set_postfix(stage=...)``
    names). ``enabled`` False: silent everywhere. On a terminal it is ``tqdm(iterable, desc,
    total, **tqdm_kw)``; off one it prints ``desc``, done/total, the time elapsed and an estimate of the
    time left every ``interval`` seconds (default ``INTERVAL``, or ``$CAUSAL_ICL_PROGRESS_S``) to stderr. ``tqdm_kw`` other than ``initial``
    (the count it starts at) apply to the bar only."""
    from tqdm.auto import tqdm  # the bar: only when one is drawn

    if not enabled or sys.stderr is None:
        return tqdm(iterable, desc=desc, total=total, disable=True)
    if _on_terminal():
        return tqdm(iterable, desc=desc, total=total, **tqdm_kw)
    return PlainLines(iterable, desc, total, interval or _interval(), tqdm_kw.get("initial", 0))


def _interval() -> float:
    """``INTERVAL``, or the seconds ``$CAUSAL_ICL_PROGRESS_S`` gives (a log read less or more often)."""
    try:
        return max(float(os.environ.get(INTERVAL_ENV, INTERVAL)), 0.01)
    except ValueError:
        return INTERVAL


def _on_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class PlainLines:
    """``progress`` off a terminal: a timer thread prints one line every ``interval`` seconds while it is
    open (``line``); the loop only counts. The thread holds no reference to it, so one left open (an
    exception before ``close``) stops when it is collected."""

    def __init__(self, iterable, desc: str, total: int | None, interval: float, initial: int = 0):
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.iterable, self.desc, self.total, self.n, self.initial = iterable, desc, total, initial, initial
        self.postfix, self.printed, self.start = "", False, time.monotonic()
        self._stop = threading.Event()
        weakref.finalize(self, self._stop.set)
        ref = weakref.ref(self)
        threading.Thread(target=_beat, args=(ref, self._stop, interval), daemon=True).start()

    def line(self) -> str:
        """``desc: n/total (pct%), elapsed, about ... left (postfix)``: where the loop stands now."""
        elapsed = time.monotonic() - self.start
        done = self.n - self.initial
        if self.total:
            where = f"{self.n}/{self.total} ({100 * self.n / self.total:.0f}%), "
            left = f", about {_clock(elapsed * (self.total - self.n) / done)} left" if 0 < done and self.n < self.total else ""
        else:  # stages, not counts: where it is is the postfix
            where, left = (f"{self.n} done, " if self.n else ""), ""
        return f"{self.desc or 'working'}: {where}{_clock(elapsed)} elapsed{left}{self.postfix}"

    def print_line(self) -> None:
        with _WRITING:  # one write per line, one line at a time: two bars' threads never split each other's lines
            sys.stderr.write(self.line() + "\n")
            sys.stderr.flush()
        self.printed = True

    def __iter__(self):
        try:
            for item in self.iterable:
                yield item
                self.n += 1
        finally:
            self.close()

    def __len__(self) -> int:
        return self.total or 0

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix(self, **kw) -> None:
        self.postfix = " (" + ", ".join(f"{k}={v}" for k, v in kw.items()) + ")" if kw else ""

    def close(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            if self.printed:  # a log that had lines gets the end too
                self.print_line()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _beat(ref, stop: threading.Event, interval: float) -> None:
    """The timer: every ``interval`` seconds, the line of the progress ``ref`` points at, until stopped."""
    while not stop.wait(interval):
        bar = ref()
        if bar is None:
            return
        bar.print_line()
        del bar
