"""models.plumbing.progress: off a terminal a plain line every interval (stage, done/total, elapsed, an
estimate of the time left), also while one step takes longer than the interval; nothing for a loop shorter
than the interval; a bar on a terminal; silent when disabled."""

from __future__ import annotations

import io
import re
import time

import pytest

from models.plumbing import progress as P


class Stream(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


LINE = re.compile(r"^(?P<desc>[\w ]+): (?P<n>\d+)/(?P<total>\d+) \(\d+%\), (\d+:\d\d:\d\d) elapsed(, about \d+:\d\d:\d\d left)?")


def test_off_a_terminal_a_line_comes_every_interval_with_stage_count_elapsed_and_estimate(monkeypatch):
    err = Stream(tty=False)
    monkeypatch.setattr("sys.stderr", err)
    for _ in P.progress(range(6), "stage one", interval=0.05):
        time.sleep(0.06)  # each step longer than the interval: the timer, not the loop, prints
    lines = err.getvalue().splitlines()
    assert len(lines) >= 4, lines  # about one a step, and the last one at the end
    for line in lines:
        m = LINE.match(line)
        assert m and m["desc"] == "stage one" and m["total"] == "6", line
    counts = [int(LINE.match(x)["n"]) for x in lines]
    assert counts == sorted(counts) and counts[-1] == 6 and "left" not in lines[-1]
    assert any("left" in x for x in lines[:-1])  # an estimate once a step is done


def test_a_loop_shorter_than_the_interval_prints_nothing_off_a_terminal(monkeypatch):
    err = Stream(tty=False)
    monkeypatch.setattr("sys.stderr", err)
    assert sum(P.progress(range(100), "quick")) == 4950
    with P.progress(desc="by hand", total=3) as bar:
        bar.update(3)
    assert err.getvalue() == ""


def test_by_hand_with_postfix_and_initial(monkeypatch):
    err = Stream(tty=False)
    monkeypatch.setattr("sys.stderr", err)
    bar = P.progress(desc="train", total=10, initial=4, interval=0.02)
    bar.update(2)
    bar.set_postfix(gap="0.0123")
    time.sleep(0.1)
    bar.close()
    first = err.getvalue().splitlines()[0]
    assert first.startswith("train: 6/10 (60%), 0:00:00 elapsed, about 0:00:00 left (gap=0.0123)")
    time.sleep(0.1)
    assert err.getvalue().splitlines()[-1].startswith("train: 6/10")  # closed: no more lines
    n = len(err.getvalue().splitlines())
    time.sleep(0.1)
    assert len(err.getvalue().splitlines()) == n


def test_an_abandoned_counter_stops_printing_once_collected(monkeypatch):
    import gc

    err = Stream(tty=False)
    monkeypatch.setattr("sys.stderr", err)
    P.progress(desc="left open", total=5, interval=0.02)  # never closed, no reference kept
    gc.collect()
    time.sleep(0.1)
    assert err.getvalue() == ""


@pytest.mark.parametrize("tty", [True, False])
def test_disabled_is_silent_and_a_terminal_gets_a_bar(monkeypatch, tty):
    err = Stream(tty=tty)
    monkeypatch.setattr("sys.stderr", err)
    assert list(P.progress(range(3), "off", enabled=False, interval=0.01)) == [0, 1, 2]
    assert err.getvalue() == ""
    if tty:
        from tqdm.auto import tqdm

        bar = P.progress(range(3), "on a terminal", file=err)
        assert isinstance(bar, tqdm)
        list(bar)
        assert "on a terminal" in err.getvalue() and "3/3" in err.getvalue()


def test_both_trainers_print_progress_lines_to_a_log(monkeypatch, tmp_path):
    """``models.train`` and ``models.standard`` with stderr a file (as under nohup or Slurm): progress lines
    with the step count, at the interval (here shortened), where a bar hidden off a terminal printed none."""
    from conftest import tiny_train_config
    from test_standard import tiny

    from models.training.standard import train_standard
    from models.training.train import train

    monkeypatch.setattr(P, "INTERVAL", 0.01)
    for name, run, steps in (
        ("train", lambda: train(tiny_train_config(tmp_path, steps=60)), 60),
        ("train standard", lambda: train_standard(tiny(steps=60), save=False), 60),
    ):
        err = Stream(tty=False)
        monkeypatch.setattr("sys.stderr", err)
        run()
        lines = [x for x in err.getvalue().splitlines() if x.startswith(f"{name}: ")]
        assert lines and lines[-1].startswith(f"{name}: {steps}/{steps} (100%)"), err.getvalue()[-500:]
        assert all(LINE.match(x) for x in lines)


def test_a_run_of_stages_names_its_stage_and_the_interval_can_be_set_from_the_environment(monkeypatch):
    err = Stream(tty=False)
    monkeypatch.setattr("sys.stderr", err)
    monkeypatch.setenv(P.INTERVAL_ENV, "0.02")
    with P.progress(desc="analyses.x") as run:
        run.set_postfix(stage="compute")
        time.sleep(0.1)
    lines = err.getvalue().splitlines()
    assert lines and all(re.match(r"^analyses\.x: \d+:\d\d:\d\d elapsed \(stage=compute\)$", x) for x in lines), lines


def test_the_tutorial_renderer_leaves_the_plain_lines_out_of_its_pages(monkeypatch):
    """docs/scripts/tutorials.py captures stderr (not a terminal, so plain lines come): they are progress, not
    output, and stay off the committed pages as tqdm's bars do."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "docs" / "scripts" / "tutorials.py"
    spec = importlib.util.spec_from_file_location("tutorials_script", path)
    tutorials = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(__import__("sys").modules, spec.name, tutorials)  # its dataclasses look themselves up
    spec.loader.exec_module(tutorials)
    capture = tutorials.Capture()
    monkeypatch.setattr("sys.stderr", capture)
    with P.progress(desc="analyses.x", interval=0.02) as run:
        run.set_postfix(stage="compute")
        time.sleep(0.1)
    print("a result", file=capture)
    assert "elapsed" in "".join(capture.parts) and capture.take() == "a result\n"
