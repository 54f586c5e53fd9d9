"""models.plumbing.progress: off a terminal, a plain line once a stage has run a few seconds and then at least
every 30 s (stage, done/total, elapsed, an estimate of the time left), a last line when it ends; nothing for a
short stage; a tqdm bar on a terminal. A fake clock stands in for time."""

from __future__ import annotations

import io
import time

from models.plumbing import progress
from models.plumbing.progress import Progress, duration


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_lines_after_a_few_seconds_then_every_30_s_with_an_estimate():
    clock, out = Clock(), io.StringIO()
    with Progress("per-head ablation", total=100, unit="runs", stream=out, clock=clock, ticking=False) as bar:
        clock.now += 2
        bar.advance(10)  # 2 s in: too early for a line
        assert out.getvalue() == ""
        clock.now += 4
        bar.advance(10)  # 6 s in, 20 done: 24 s left at this rate
        clock.now += 20
        bar.advance(10)  # 20 s after the last line: none
        clock.now += 11
        bar.tick()  # 31 s after it, no work finished since: a line all the same
        clock.now += 3
        bar.advance(70)
    lines = out.getvalue().splitlines()
    assert lines == [
        "progress: per-head ablation 20/100 runs, 6 s elapsed, about 24 s left",
        "progress: per-head ablation 30/100 runs, 37 s elapsed, about 1 min 26 s left",
        "progress: per-head ablation done, 100 runs in 40 s",
    ]


def test_a_short_stage_prints_nothing_and_a_terminal_gets_a_bar():
    clock, out = Clock(), io.StringIO()
    with Progress("quick", total=3, stream=out, clock=clock, ticking=False) as bar:
        for _ in range(3):
            clock.now += 1
            bar.advance()
    assert out.getvalue() == ""
    term = io.StringIO()
    with Progress("on a terminal", total=4, unit="runs", stream=term, terminal=True) as bar:
        bar.advance(2)
        assert bar.bar is not None and bar.bar.n == 2  # tqdm draws it; no plain line
    assert "progress:" not in term.getvalue()


def test_the_ticker_prints_while_one_long_piece_of_work_runs(monkeypatch):
    monkeypatch.setattr(progress, "FIRST_LINE", 0.0)
    clock, out = Clock(), io.StringIO()
    bar = Progress("one long pass", total=2, stream=out, clock=clock)  # its thread checks every second
    clock.now += 1
    for _ in range(50):  # up to 5 s of real time for the thread to print
        if out.getvalue():
            break
        time.sleep(0.1)
    bar.close()
    assert out.getvalue().splitlines()[0] == "progress: one long pass 0/2 it, 1 s elapsed, estimating the time left"


def test_durations_read_as_words():
    assert [duration(s) for s in (4.6, 75.3, 3725)] == ["5 s", "1 min 15 s", "1 h 2 min"]
