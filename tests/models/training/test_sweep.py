"""models.training.sweep: a two-cell phase-diagram sweep really trained through each engine this machine can run
equals the two cells trained directly in this process; results come back in order whatever order the jobs
end in; every job runs at the thread count asked; the Slurm executor carries the partition and the
parameters into its sbatch script (submitted to a stand-in sbatch: no Slurm here); bad flags exit 2."""

from __future__ import annotations

import os
import stat
import time

import pytest
import torch

from analyses import phase_diagram
from analyses.phase_diagram import Grid, train_cell
from models.training import sweep

# Two cells of the phase diagram, small enough for CI but trained for real: a GPT-2 and the disentangled
# model (each evaluated at steps 0, 4 and 8 on held-out contexts).
GRID = Grid(
    kernels=[(0.3, 0.05)],
    rows=[(2, "all")],
    families=["gpt2", "disentangled"],
    steps=8,
    disentangled_steps=8,
    eval_every=4,
    eval_contexts=32,
    seq_len=4,
    boundary=-1.0,  # no boundary cells: exactly the two cells
    d_model=8,
    n_heads=2,
    d_mlp=16,
    batch_size=16,
)


def numbers(run: dict) -> dict:
    """A run's numbers without its wall time."""
    return {k: v for k, v in run.items() if k != "seconds"}


def square_after(x: int, delay: float = 0.0, wait_for: str = "", write: str = "") -> tuple[int, int]:
    """x squared, and the torch threads the job ran at; after ``delay`` seconds, after the file ``wait_for``
    exists (a few minutes at most), and after writing the file ``write``."""
    time.sleep(delay)
    deadline = time.monotonic() + 300
    while wait_for and not os.path.exists(wait_for) and time.monotonic() < deadline:
        time.sleep(0.01)
    if write:
        open(write, "w").close()
    return x * x, torch.get_num_threads()


def fail(message: str):
    raise ValueError(message)


@pytest.fixture(scope="module")
def direct():
    """The two cells trained in this process, one after the other, in reverse order (a result that
    depended on what ran before it in the same process would differ from the engines')."""
    with torch.random.fork_rng(), phase_diagram.common.single_thread():
        cells = phase_diagram.cells_of(GRID)
        runs = [train_cell(**cell, seed=0, grid=GRID) for cell in reversed(cells)][::-1]
    return cells, [numbers(r) for r in runs]


def test_the_two_cell_sweep_through_the_local_engine_equals_the_cells_run_directly(direct):
    cells, want = direct
    assert [c["family"] for c in cells] == ["gpt2", "disentangled"]
    res = phase_diagram.train_grid(GRID, seed=0, log=lambda s: None, cluster="local", jobs=2)
    got = [numbers(run) for c in res["cells"] for run in c["runs"]]
    assert [c["seeds"] for c in res["cells"]] == [[0], [0]]
    assert got == [{"seed": 0, **w} for w in want]  # bit for bit: every number of every evaluation
    assert all(r["steps"] == [0, 4, 8] for r in want)
    assert res["engine"]["cluster"] == "local" and res["engine"]["jobs"] == 2


def test_the_submitit_path_equals_the_cells_run_directly(direct, tmp_path):
    """submitit's local executor: every job a fresh process started from the pickles, as on Slurm."""
    cells, want = direct
    kwargs = [{**cell, "seed": 0, "grid": GRID} for cell in cells]
    got = sweep.run_jobs(train_cell, kwargs, "submitit-local", jobs=2, threads=1, folder=tmp_path)
    assert [numbers(r) for r in got] == want
    assert list(tmp_path.rglob("*_result.pkl")), "submitit wrote no result pickles"


@pytest.mark.parametrize("jobs", [1, 2])
def test_results_come_back_in_order_at_the_threads_asked(jobs, tmp_path):
    # With 2 jobs at once the first ends after the second: it waits for the file the second writes (no
    # wall-clock race: a worker slow to start on a busy machine only makes the first wait longer).
    marker = str(tmp_path / "second_done") if jobs == 2 else ""
    kwargs = [{"x": 0, "wait_for": marker}, {"x": 1, "write": marker}, {"x": 2}]
    threads = torch.get_num_threads() + 1 if jobs == 1 else 1  # in this process: set, then restored
    before, done = torch.get_num_threads(), []
    got = sweep.run_jobs(
        square_after,
        kwargs,
        "local",
        jobs,
        threads=threads,
        on_done=lambda i, r: done.append((i, r)),
    )
    assert got == [(0, threads), (1, threads), (4, threads)]
    assert sorted(done) == list(enumerate(got))  # once per job, with its own result
    assert (done[0][0] != 0) == (jobs == 2)
    assert torch.get_num_threads() == before
    assert sweep.run_jobs(square_after, [], "local", jobs) == []
    if jobs == 1:  # the default: this process's count
        assert sweep.run_jobs(square_after, [{"x": 2, "delay": 0}], "local", 1) == [(4, before)]


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_failing_job_raises_here(jobs):
    with pytest.raises(ValueError, match="cell 1 failed"):
        sweep.run_jobs(fail, [{"message": "cell 1 failed"}, {"message": "cell 1 failed"}], "local", jobs)


def fake_slurm(tmp_path, monkeypatch):
    """``srun`` and ``sbatch`` stand-ins on PATH: sbatch keeps the script it was given and answers as Slurm
    does. Returns where the scripts go."""
    bin_dir, scripts = tmp_path / "bin", tmp_path / "sbatch_scripts"
    bin_dir.mkdir()
    scripts.mkdir()
    for name, body in {
        "srun": "exit 0",
        "sbatch": f'cp "$1" "{scripts}/$(date +%s%N).sh"\necho "Submitted batch job 4242"',
    }.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return scripts


def test_the_slurm_executor_carries_the_partition_and_the_parameters(tmp_path, monkeypatch):
    scripts = fake_slurm(tmp_path, monkeypatch)
    ex = sweep.executor("slurm:gpu-short", tmp_path / "sweep", jobs=2, threads=3, timeout_min=30, name="train_cell")
    kwargs = [{"x": x, "delay": 0.0} for x in range(5)]
    submitted = ex.map_array(sweep._call, [square_after] * 5, kwargs, [3] * 5)
    assert [job.job_id for job in submitted] == [f"4242_{i}" for i in range(5)]
    (script,) = [p.read_text() for p in scripts.iterdir()]  # one sbatch call: one job array
    for line in (
        "#SBATCH --partition=gpu-short",
        "#SBATCH --array=0-4%2",  # 5 jobs, at most 2 at once
        "#SBATCH --cpus-per-task=3",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --nodes=1",
        "#SBATCH --time=30",
        "#SBATCH --job-name=train_cell",
    ):
        assert line in script.splitlines(), (line, script)
    # What each array task will run: the pickled job computes that task's own result.
    assert [job.submission().result() for job in submitted] == [(x * x, 3) for x in range(5)]


@pytest.mark.parametrize(
    "cluster, message",
    [
        ("ray", "--cluster 'ray' is not a cluster; expected local, submitit-local or slurm:PARTITION"),
        ("slurm", "--cluster 'slurm' names no partition; expected slurm:PARTITION"),
        ("slurm: ", "names no partition"),
        ("local:gpu", "is not a cluster"),
    ],
)
def test_a_bad_cluster_is_one_line(cluster, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        sweep.parse_cluster(cluster)
    assert sweep.parse_cluster("slurm:gpu") == ("slurm", "gpu")


def test_a_submitit_cluster_without_submitit_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "submitit", None)  # as if it were not installed
    with pytest.raises(ValueError, match=r"needs submitit, which is not installed; pip install -e \"\.\[sweep\]\""):
        sweep.parse_cluster("slurm:gpu")
    assert sweep.parse_cluster("local") == ("local", None)  # the default needs nothing


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--full", "--cluster", "slurm"], "--cluster 'slurm' names no partition"),
        (["--full", "--cluster", "ray"], "is not a cluster"),
        (["--full", "--jobs", "0"], "--jobs must be in [1, 1024], got 0"),
        (["--jobs", "2"], "--jobs applies to training; add --quick or --full"),
        (["--cluster", "slurm:gpu"], "--cluster applies to training"),
    ],
)
def test_bad_sweep_flags_exit_2_before_any_work(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        phase_diagram.main([*argv, "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


JOBS = '''
import os, time


def job(i, folder):
    """Job 0 ends at once; the others sleep for minutes, writing their pid first."""
    with open(os.path.join(folder, f"pid_{i}"), "w") as f:
        f.write(str(os.getpid()))
    if i:
        time.sleep(300)
    return i
'''
MAIN = '''
import sys

from models.plumbing.io import run_cli
from models.training import sweep
import slow_jobs


def main(argv):
    folder = argv[0]
    with open(folder + "/done", "a") as done:
        try:
            sweep.run_jobs(slow_jobs.job, [dict(i=i, folder=folder) for i in range(3)], "local", 2, threads=1,
                           on_done=lambda i, r: (done.write(f"{r}\\n"), done.flush()))
        except KeyboardInterrupt:
            raise KeyboardInterrupt("the finished jobs are kept") from None


if __name__ == "__main__":
    run_cli(main, sys.argv[1:], "prog")
'''


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, whose parent has gone, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
def test_ctrl_c_to_the_main_process_stops_the_workers_and_keeps_what_finished(tmp_path, name):
    """A SIGINT to the main process of a pool was ignored while the workers trained on (it waited for them), and
    what finished meanwhile was never reported: now the workers stop at once, every finished job is kept, exit 130.
    SIGTERM (``kill``, ``timeout``, a batch scheduler) ended the main process at once with no message while its
    workers trained on (issue 52): now it is handled as SIGINT."""
    import signal
    import subprocess
    import sys

    (tmp_path / "slow_jobs.py").write_text(JOBS)
    (tmp_path / "main.py").write_text(MAIN)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    # SIGINT as a terminal delivers it: a shell's background job (CI started with `&`) inherits it ignored,
    # and Python then installs no KeyboardInterrupt at all
    proc = subprocess.Popen([sys.executable, str(tmp_path / "main.py"), str(tmp_path)], env=env,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    deadline = time.monotonic() + 240  # the workers start (spawned: they import torch) on a busy machine
    while not ((tmp_path / "pid_1").exists() and (tmp_path / "pid_2").exists()):
        assert proc.poll() is None and time.monotonic() < deadline, "the pool did not start its jobs"
        time.sleep(0.2)
    time.sleep(0.5)
    proc.send_signal(getattr(signal, name))
    try:
        _, err = proc.communicate(timeout=120)  # the sleeping jobs would hold it for 300 s
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the main process waited for its workers after SIGINT") from None
    assert proc.returncode == 130 and err.strip().splitlines() == ["prog: error: interrupted: the finished jobs are kept"]
    assert (tmp_path / "done").read_text().split() == ["0"]
    workers = [int((tmp_path / f"pid_{i}").read_text()) for i in (1, 2)]
    time.sleep(1)
    assert not any(alive(pid) for pid in workers)
