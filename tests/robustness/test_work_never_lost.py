"""Work lost: training never replaces a checkpoint unless asked, two writers of one --out cannot both run,
and the folder write leaves the old or the new checkpoint, whole, whatever step fails or is killed."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import forked
import pytest
import safetensors.torch
import torch
from conftest import build_task
from test_formats import small_model

import models
from models.loading import checkpoint
from models.plumbing import io
from models.plumbing.io import Busy, exclusive_lock
from models.training import train
from models.training.train import training_lock

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--d-vocab", "3", "--n-examples", "2", "--seq-len", "3", "--batch-size", "8", "--eval-contexts", "16"]


def tree(folder: Path) -> dict[str, bytes | str]:
    """Every entry under ``folder`` (hidden ones and folders included): file bytes, 'dir' or a link target."""
    out: dict[str, bytes | str] = {}
    for p in sorted(folder.rglob("*")):
        key = str(p.relative_to(folder))
        out[key] = f"-> {os.readlink(p)}" if p.is_symlink() else "dir" if p.is_dir() else p.read_bytes()
    return out


def weights(path: Path) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(path / checkpoint.WEIGHTS)


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def debris(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


# Fault injection: every step of the folder write fails once ------------------------------------------
STEPS = [
    (os, "rename"),
    (os, "mkdir"),
    (os, "fsync"),
    (checkpoint, "_exchange"),
    (checkpoint.shutil, "rmtree"),
    (safetensors.torch, "save_file"),
]


class Crash(BaseException):
    """An injected failure (a BaseException, like a KeyboardInterrupt or SystemExit mid-write)."""


def _count_steps(monkeypatch, action) -> int:
    """How many calls of the patched functions ``action()`` makes."""
    calls = [0]
    for owner, name in STEPS:
        original = getattr(owner, name)

        def counted(*a, _original=original, **k):
            calls[0] += 1
            return _original(*a, **k)

        monkeypatch.setattr(owner, name, counted)
    action()
    monkeypatch.undo()
    return calls[0]


def _fail_at_in(monkeypatch, steps, n: int) -> None:
    """Make the n-th call (0-based) among the functions ``steps`` names raise ``Crash``."""
    calls = [0]
    for owner, name in steps:
        original = getattr(owner, name)

        def failing(*a, _original=original, _name=name, **k):
            calls[0] += 1
            if calls[0] - 1 == n:
                raise Crash(f"injected failure in {_name}")
            return _original(*a, **k)

        monkeypatch.setattr(owner, name, failing)


def _setup_old(tmp_path: Path):
    path = tmp_path / "run"
    old_model, task = small_model()
    models.save(old_model, path, task=task)
    (path / "snapshots").mkdir()
    (path / "snapshots" / "notes.txt").write_text("kept across replacements")
    return path, old_model, weights(path), task


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2-exchange", "two-renames"])
@pytest.mark.parametrize("killed", [False, True], ids=["raise-and-clean-up", "killed-no-clean-up"])
def test_a_failure_at_any_step_of_the_folder_write_leaves_old_or_new(tmp_path, monkeypatch, exchange, killed):
    path, old_model, old, task = _setup_old(tmp_path)
    new_model, _ = small_model(beta=5.0)
    new_state = {k: v.detach().clone() for k, v in new_model.state_dict().items()}
    if not exchange:
        monkeypatch.setattr(checkpoint, "_exchange", lambda a, b: False)
    n_steps = _count_steps(monkeypatch, lambda: models.save(new_model, tmp_path / "probe", task=task))
    assert n_steps >= 8  # the write really goes through the patched functions
    seen = set()
    for n in range(n_steps):
        models.save(old_model, path, task=task)  # back to the old checkpoint
        assert same(weights(path), old)
        if not exchange:
            monkeypatch.setattr(checkpoint, "_exchange", lambda a, b: False)
        if killed:  # a kill runs no clean-up: the next start's recover() must cope with what is left
            monkeypatch.setattr(checkpoint, "_recover", lambda p: None)
        _fail_at_in(monkeypatch, STEPS, n)
        with pytest.raises(Crash):
            models.save(new_model, path, task=task)
        monkeypatch.undo()
        if path.exists():  # at every instant: the old or the new checkpoint, loadable
            now = weights(path)
            assert same(now, old) or same(now, new_state), n
            models.load(path)
        else:  # only between the two renames of the fallback; the old one waits at .run.old
            assert killed and not exchange, n
            assert same(weights(tmp_path / ".run.old"), old)
        checkpoint.recover(path)  # what the next training start (or write) does
        now = weights(path)
        seen.add("old" if same(now, old) else "new" if same(now, new_state) else "?")
        assert (path / "snapshots" / "notes.txt").read_text() == "kept across replacements", n
        assert debris(tmp_path) == [], (n, debris(tmp_path))
        assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors", "snapshots"]
    assert seen <= {"old", "new"} and "old" in seen
    models.save(new_model, path, task=task)  # and the write still works afterwards
    assert same(weights(path), new_state) and debris(tmp_path) == []


def test_concurrent_writers_of_one_folder_take_turns(tmp_path):
    path = tmp_path / "run"
    task = build_task()
    candidates = [small_model(beta=b)[0] for b in (2.0, 4.0)]
    states = [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in candidates]
    errors = []

    def writer(model):
        try:
            for _ in range(15):
                models.save(model, path, task=task)
                now = weights(path)  # whoever wrote last: one of the two, whole
                assert any(same(now, s) for s in states)
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(m,)) for m in candidates]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert any(same(weights(path), s) for s in states)
    assert debris(tmp_path) == []


def _train_argv(out: Path, *extra: str) -> list[str]:
    return [*TINY, "--steps", "6", "--eval-every", "3", "--out", str(out), *extra]


def _one_line_exit(capsys, argv, expected: str) -> None:
    with pytest.raises(SystemExit) as e:
        train.main(argv)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert e.value.code == 2 and len(err) == 1 and expected in err[0], err


def test_second_training_into_one_out_errors_at_once(tmp_path, capsys):
    out = tmp_path / "run"
    with exclusive_lock(training_lock(out), wait=False):  # as a running training holds it
        before = tree(tmp_path)
        # This process holds the lock until the block ends: a training that waited for it would never
        # return (the alarm turns that hang into a failure), so the refusal came without waiting.
        with forked.bounded():
            _one_line_exit(capsys, _train_argv(out), "another process is writing --out")
        assert tree(tmp_path) == before
        with pytest.raises(Busy):
            with exclusive_lock(training_lock(out), wait=False):
                pass
    assert debris(tmp_path) == []  # the lock file goes with the lock


def test_a_training_locked_by_another_process_errors_at_once(tmp_path, capsys):
    """Another process (plain fcntl, no import of ours) holds the lock: the training fails at once."""
    out = tmp_path / "run"
    holder = "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
    holder += "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(100000)"
    proc = subprocess.Popen([sys.executable, "-c", holder, str(training_lock(out))], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with forked.bounded():  # the holder never lets go: a training that waited would hang
            _one_line_exit(capsys, _train_argv(out), "another process is writing --out")
        assert proc.poll() is None and not out.exists()  # refused while the lock was still held
    finally:
        proc.kill()
        proc.wait()


def test_train_refuses_to_replace_work_unless_asked(tmp_path, capsys):
    shipped_like = tmp_path / "final"
    models.save(small_model()[0], shipped_like, task=build_task())  # no training state, like the shipped one
    run = tmp_path / "run"
    train.main(_train_argv(run))
    capsys.readouterr()
    before = tree(tmp_path)
    _one_line_exit(capsys, _train_argv(run), "refusing to replace it: pass --overwrite")
    _one_line_exit(capsys, _train_argv(shipped_like), "refusing to replace it: pass --overwrite")
    _one_line_exit(capsys, _train_argv(shipped_like, "--resume"), "has no training state")
    _one_line_exit(capsys, _train_argv(tmp_path / "absent", "--resume"), "does not exist")
    assert tree(tmp_path) == before
    train.main(_train_argv(run, "--resume"))  # a finished run with state: resuming is fine (nothing to do)
    assert tree(tmp_path) == before
    train.main(_train_argv(shipped_like, "--overwrite", "--seed", "3"))
    assert (shipped_like / checkpoint.WEIGHTS).read_bytes() != before[f"final/{checkpoint.WEIGHTS}"]
    assert (shipped_like / checkpoint.TRAIN_STATE).is_file() and debris(tmp_path) == []


def test_resume_recovers_an_interrupted_write(tmp_path, monkeypatch):
    """The debris of a write killed between its renames: --resume restores the old checkpoint and goes on."""
    run = tmp_path / "run"
    original = train._save

    def save_then_stop(*args):  # a 6-step run stopped once its step-3 checkpoint is written
        original(*args)
        if args[7] == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(train, "_save", save_then_stop)
    with pytest.raises(SystemExit):
        train.main(_train_argv(run))
    monkeypatch.setattr(train, "_save", original)
    history = checkpoint.read_config(run)["training"]["history"]
    os.rename(run, tmp_path / ".run.old")  # killed just after the first rename
    (tmp_path / ".run.new").mkdir()
    (tmp_path / ".run.new" / "model.safetensors").write_bytes(b"half")
    train.main(_train_argv(run, "--resume"))
    resumed = checkpoint.read_config(run)["training"]["history"]
    assert [m["step"] for m in resumed] == [m["step"] for m in history] + [6]
    assert debris(tmp_path) == []


def _wait_for_a_save(meta: Path, before: int | None, proc, timeout: float = forked.HANG_S) -> None:
    """Until the process ``proc`` (``forked.start``'s) has written a checkpoint of its own (``train_state.json``
    replaced)."""
    deadline = time.time() + timeout
    while not meta.is_file() or meta.stat().st_mtime_ns == before:
        assert proc.is_alive() and time.time() < deadline, "training ended before writing a checkpoint"
        time.sleep(0.01)


def kill9_trial(tmp_path: Path, n_kills: int, steps: int, seed: int = 0) -> list[dict]:
    """Kill -9 a small training (a checkpoint every step; ``python -m models.train`` in a process forked from
    the suite's server, tests/helpers/forked.py) at ``n_kills`` random instants, each after the process has
    written a checkpoint of its own; check that a checkpoint loads after every kill, then resume to the end.
    Returns, per kill, the delay, the step saved and the debris the kill left."""
    out = tmp_path / "killed"
    meta = out / checkpoint.TRAIN_META
    rng = random.Random(seed)
    argv = [*TINY, "--steps", str(steps), "--eval-every", "1", "--out", str(out)]
    kills = []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for i in range(n_kills):
        before = meta.stat().st_mtime_ns if meta.is_file() else None
        proc = forked.start("models.train", *argv, *(["--resume"] if i else []), cwd=ROOT, env=env)
        _wait_for_a_save(meta, before, proc)
        delay = rng.uniform(0.0, 0.3)
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        assert proc.exitcode == -signal.SIGKILL, "the training ended before the kill: give it more steps"
        left = debris(tmp_path)
        models.load(out)  # a checkpoint that loads, every time (before any recovery)
        assert models.load_task(out).d_vocab == 3
        kills.append({"delay": delay, "step": checkpoint.read_config(out)["training"]["step"], "debris": left})
    train.main([*argv, "--resume"])
    assert debris(tmp_path) == []
    return kills


def test_kill9_at_random_instants_then_resume_gives_the_uninterrupted_weights(tmp_path):
    n_kills = int(os.environ.get("KILL9_TRIALS", "3"))  # KILL9_TRIALS=20 for the full measurement
    # Enough steps that the kills land before the end even on a quiet machine (a run checkpoints every
    # step, ~15 steps between its first save and its kill there): otherwise a resumed run has nothing left.
    steps = 40 + 40 * n_kills
    torch.set_num_threads(1)
    kills = kill9_trial(tmp_path, n_kills, steps)
    print("kills:", kills)
    train.main([*TINY, "--steps", str(steps), "--eval-every", "1", "--out", str(tmp_path / "full")])
    assert same(weights(tmp_path / "killed"), weights(tmp_path / "full"))
    killed = checkpoint.read_config(tmp_path / "killed")["training"]["history"]
    full = checkpoint.read_config(tmp_path / "full")["training"]["history"]
    assert [m["step"] for m in killed] == [m["step"] for m in full]  # no evaluation lost or repeated
    assert [m["nll"] for m in killed] == [m["nll"] for m in full]


# An analysis's figures and JSON: one set (models.plumbing.io.write_set) -----------------------------------------
SET_STEPS = [(os, "rename"), (os, "replace"), (os, "mkdir"), (os, "chmod"), (os, "rmdir")]


def _set(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and not p.name.startswith(".")}


def _writers(tag: str) -> dict:
    return {f: (lambda p, b=f"{tag}:{f}".encode(): p.write_bytes(b)) for f in ("fig.png", "fig.pdf", "x.json")}


@pytest.mark.parametrize("killed", [False, True], ids=["raise-and-clean-up", "killed-no-clean-up"])
def test_a_set_is_all_old_or_all_new_whatever_step_fails(tmp_path, monkeypatch, killed):
    folder = tmp_path / "figures"
    folder.mkdir()
    (folder / "other.png").write_bytes(b"another analysis")
    io.write_set(folder, "x", _writers("old"))
    old = _set(folder)
    calls = [0]
    for owner, name in SET_STEPS:
        original = getattr(owner, name)
        monkeypatch.setattr(
            owner, name, lambda *a, _o=original, **k: (calls.__setitem__(0, calls[0] + 1), _o(*a, **k))[1]
        )
    io.write_set(folder, "x", _writers("new"))
    monkeypatch.undo()
    new, n_steps = _set(folder), calls[0]
    assert n_steps >= 6 and new != old
    outcomes = set()
    for n in range(n_steps + 3):  # + the three writers
        io.write_set(folder, "x", _writers("old"))
        writers = _writers("new")
        if n >= n_steps:  # a writer fails (a figure that cannot be rendered)
            victim = sorted(writers)[n - n_steps]
            writers[victim] = lambda p: (_ for _ in ()).throw(Crash("render failed"))
        else:
            _fail_at_in(monkeypatch, SET_STEPS, n)
        if killed:  # no clean-up runs: the next call must cope
            monkeypatch.setattr(io.shutil, "rmtree", lambda *a, **k: None)
        with pytest.raises(Crash):
            io.write_set(folder, "x", writers)
        monkeypatch.undo()
        for left in folder.glob(".x.set-*"):  # as if the killed run were another, dead process
            left.rename(folder / f".x.set-999999999-{left.name.rsplit('-', 1)[1]}")
        io.recover_set(folder, "x")
        now = _set(folder)
        assert now == {**old, "other.png": b"another analysis"} or now == new, (n, now)
        outcomes.add("new" if now == new else "old")
        assert debris(folder) == [], (n, debris(folder))
    assert outcomes == {"old", "new"}  # failures before the commit point keep the old set, after it finish the new


def test_two_runs_writing_one_set_leave_one_whole_set(tmp_path):
    folder = tmp_path / "figures"
    folder.mkdir()
    errors, seen = [], []

    def run(tag):
        try:
            for _ in range(20):
                io.write_set(folder, "x", _writers(tag))
                with exclusive_lock(folder / ".x.lock"):  # as the writers see it between their turns
                    seen.append({v.split(b":")[0] for v in _set(folder).values()})
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(tag,)) for tag in ("A", "B")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert all(len(tags) == 1 for tags in seen)  # never one run's PNG beside the other's PDF and JSON
    assert debris(folder) == []
