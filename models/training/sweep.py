"""Sweeps of independent jobs (the phase diagram's cells, their extra seeds, the paper run's analyses), on
this machine or on a Slurm cluster: ``run_jobs(fn, kwargs_list, cluster, jobs)`` returns
``[fn(**kwargs) for kwargs in kwargs_list]``, in order, however the jobs were spread.

    run_jobs(train_cell, cells)                              # here, in this process, one after another
    run_jobs(train_cell, cells, jobs=2)                      # here, a pool of 2 processes
    run_jobs(train_cell, cells, "slurm:gpu", jobs=16)        # a Slurm job array on partition gpu

``cluster`` (the entry points' ``--cluster``):
- ``local`` (default): standard library only. ``jobs`` 1 runs in this process; more, a pool of that many
  spawned processes.
- ``slurm:PARTITION``: submitit (``pip install -e ".[sweep]"``) submits one job array to PARTITION, at most
  ``jobs`` of its tasks running at once, each one task with ``threads`` CPUs and ``timeout_min`` minutes;
  ``fn`` and its arguments are pickled into ``folder`` (on a file system the nodes share, as is this
  checkout and its virtual environment) and the results read back from there.
- ``submitit-local``: the same submitit path without Slurm (its ``LocalExecutor``): every job a fresh
  process started from the pickles in ``folder``, at most ``jobs`` at a time. Before a cluster, it checks on
  one machine that every job pickles and runs alone.

Every job runs at ``threads`` torch threads (default: this process's count, which the entry points set
from ``--threads``, default 1) and draws its randomness from its own arguments, so its numbers do not
depend on the engine, the number of jobs or the order the jobs ran in (tests/models/training/test_sweep.py).
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed, wait
from dataclasses import fields
from multiprocessing import get_context
from pathlib import Path

from models.plumbing.config import Config, option
from models.plumbing.io import UsageError
from models.plumbing.progress import progress as progress_bar

CLUSTERS = "local, submitit-local or slurm:PARTITION"
MAX_JOBS = 1024
TIMEOUT_MIN = 60  # a job's time limit on Slurm (and under submitit-local); no job of this suite comes near it
SWEEPS_DIR = Path("runs") / "sweeps"  # submitit's pickles and logs, relative to the working folder
POLL_S = {"local": 0.5, "slurm": 10.0}  # how often submitit is asked whether a job has finished


def parse_cluster(cluster: str) -> tuple[str, str | None]:
    """``"local"`` -> ``("local", None)``, ``"submitit-local"`` -> ``("submitit-local", None)``,
    ``"slurm:gpu"`` -> ``("slurm", "gpu")``; anything else one ``ValueError`` naming ``--cluster``. The
    submitit clusters need submitit installed (the ``sweep`` extra)."""
    kind, colon, partition = cluster.partition(":")
    if kind == "slurm" and not partition.strip():
        raise UsageError(f"--cluster {cluster!r} names no partition; expected slurm:PARTITION, e.g. slurm:gpu")
    if (kind, colon) not in {("local", ""), ("submitit-local", ""), ("slurm", ":")}:
        raise UsageError(f"--cluster {cluster!r} is not a cluster; expected {CLUSTERS}")
    if kind != "local":
        try:
            import submitit  # noqa: F401 (the optional engine: only these clusters need it)
        except ImportError:
            raise UsageError(
                f"--cluster {cluster} needs submitit, which is not installed; pip install -e \".[sweep]\""
            ) from None
    return kind, partition.strip() or None


class SweepConfig(Config):
    """The fields of a config whose runs are a sweep of jobs: where they run and how many at once."""

    cluster: str = option("local", "where the jobs run: 'local' (this machine: in this process for --jobs 1, else a "
                          "pool of --jobs processes), 'slurm:PARTITION' (a Slurm job array on PARTITION through "
                          "submitit; pip install -e \".[sweep]\") or 'submitit-local' (submitit's path without Slurm: "
                          f"every job a fresh process, a check before a cluster); logs and pickles in {SWEEPS_DIR}/")  # fmt: skip
    jobs: int = option(1, "jobs running at once (the result does not depend on it)", minimum=1, maximum=MAX_JOBS)

    def validate(self) -> None:
        parse_cluster(self.cluster)


def add_flags(p, jobs: int = 1) -> None:
    """``--cluster`` and ``--jobs`` (default ``jobs``) of an entry point that runs a sweep and has no config of its
    own (``analyses.paper``): ``SweepConfig``'s fields."""
    for f in fields(SweepConfig):
        if f.name in ("cluster", "jobs"):
            default = jobs if f.name == "jobs" else f.default
            p.add_argument("--" + f.name, type=int if f.name == "jobs" else str, default=default,
                           help=f"{f.metadata['help']} (default: {default})")  # fmt: skip


def check_flags(p, args) -> None:
    """``--cluster`` and ``--jobs`` checked before any work (``parser.error``: one line, exit 2)."""
    try:
        SweepConfig(cluster=args.cluster, jobs=args.jobs)
    except (TypeError, ValueError) as e:
        p.error(("--" + str(e)) if str(e).startswith(("jobs", "cluster")) else str(e))


def run_jobs(
    fn: Callable,
    kwargs_list: list[dict],
    cluster: str = "local",
    jobs: int = 1,
    threads: int | None = None,
    folder: str | Path | None = None,
    timeout_min: int = TIMEOUT_MIN,
    on_done: Callable[[int, object], None] | None = None,
) -> list:
    """``[fn(**kwargs) for kwargs in kwargs_list]``, each call a job on ``cluster`` (module docstring), at most
    ``jobs`` at a time, each at ``threads`` torch threads (default: this process's count). ``fn`` must be a
    module-level function (jobs in other processes import it by name). ``on_done(i, result)`` is called here
    as job ``i`` finishes. A job's error is raised here, after the jobs still waiting are cancelled.
    ``folder``: submitit's pickles and logs (default ``runs/sweeps/<fn's module.name>``)."""
    kind, partition = parse_cluster(cluster)
    import torch

    from probes.tasks import check_int

    check_int(jobs, "jobs", 1, MAX_JOBS)
    threads = torch.get_num_threads() if threads is None else check_int(threads, "threads", 1, MAX_JOBS)
    if not kwargs_list:
        return []
    with progress_bar(desc=f"{fn.__name__} jobs", total=len(kwargs_list)) as bar:  # off a terminal: a line every 30 s

        def done(i: int, result) -> None:
            bar.update()
            if on_done is not None:
                on_done(i, result)

        return _run(fn, kwargs_list, kind, cluster, jobs, threads, folder, timeout_min, done)


def _run(fn, kwargs_list, kind, cluster, jobs, threads, folder, timeout_min, on_done) -> list:
    """``run_jobs`` once its arguments are checked: the jobs on the engine ``kind`` names."""
    if kind == "local" and jobs == 1:
        results = []
        for i, kwargs in enumerate(kwargs_list):
            results.append(_call(fn, kwargs, threads))
            on_done(i, results[-1])
        return results
    if kind == "local":
        return _pool(fn, kwargs_list, jobs, threads, on_done)
    folder = SWEEPS_DIR / f"{fn.__module__}.{fn.__name__}" if folder is None else folder
    ex = executor(cluster, folder, jobs, threads, timeout_min, name=fn.__name__)
    return _submitit(ex, fn, kwargs_list, jobs if kind == "submitit-local" else len(kwargs_list), threads, on_done)


def executor(cluster: str, folder: str | Path, jobs: int, threads: int, timeout_min: int = TIMEOUT_MIN, name: str = "sweep"):
    """The submitit executor of a submitit ``cluster``: one task per job, ``threads`` CPUs each, at most
    ``jobs`` array tasks at once (Slurm's ``--array=0-N%jobs``), on the partition ``cluster`` names."""
    import submitit  # the optional engine (the sweep extra); parse_cluster has checked that it is installed

    kind, partition = parse_cluster(cluster)
    ex = submitit.AutoExecutor(folder=folder, cluster="slurm" if kind == "slurm" else "local")
    ex.update_parameters(name=name, timeout_min=timeout_min, nodes=1, tasks_per_node=1, cpus_per_task=threads)
    if kind == "slurm":
        ex.update_parameters(slurm_partition=partition, slurm_array_parallelism=jobs)
    return ex


def _call(fn: Callable, kwargs: dict, threads: int):
    """One job, wherever it runs: ``fn(**kwargs)`` at ``threads`` torch threads (the count is restored)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return fn(**kwargs)
    finally:
        torch.set_num_threads(before)


def _pool(fn, kwargs_list, jobs, threads, on_done) -> list:
    """The local engine: a pool of spawned processes (no state shared with this one), in submission order.
    The workers ignore SIGINT: Ctrl-C (to this process, or to the terminal's whole group) is this process's
    ``KeyboardInterrupt``, which stops the workers at once, after ``on_done`` for every job that finished.
    A job's error cancels the jobs still waiting and lets the running ones finish (``on_done`` for each)."""
    results = [None] * len(kwargs_list)
    reported: set[int] = set()
    terminate = _terminate_as_interrupt()  # SIGTERM (kill, timeout, a scheduler) stops the pool as Ctrl-C does
    pool = ProcessPoolExecutor(min(jobs, len(kwargs_list)), mp_context=get_context("spawn"), initializer=_ignore_sigint)
    futures = {pool.submit(_call, fn, kwargs, threads): i for i, kwargs in enumerate(kwargs_list)}
    try:
        for future in as_completed(futures):
            i = futures[future]
            results[i] = future.result()
            reported.add(i)
            on_done(i, results[i])
    except BaseException as e:
        for future in futures:
            future.cancel()
        if isinstance(e, KeyboardInterrupt):
            for process in list((pool._processes or {}).values()):  # the executor has no public way to stop them
                process.terminate()
        else:
            wait(futures)
        for future, i in futures.items():  # what finished meanwhile is kept
            if i not in reported and future.done() and not future.cancelled() and future.exception() is None:
                on_done(i, future.result())
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        terminate()
    return results


def _terminate_as_interrupt() -> Callable[[], None]:
    """In the main thread, SIGTERM raises ``KeyboardInterrupt`` (what ``kill``, ``timeout`` and batch schedulers send
    is handled as Ctrl-C: the workers stopped, the finished jobs kept); returns what restores the old handler."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, interrupt)
    return lambda: signal.signal(signal.SIGTERM, before)


def _ignore_sigint() -> None:
    """A pool worker's start: SIGINT is the main process's to handle (``_pool``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _submitit(ex, fn, kwargs_list, wave: int, threads, on_done) -> list:
    """The submitit engines: the jobs submitted in waves of ``wave`` (Slurm: all at once, as one array whose
    parallelism the executor holds; the local executor would otherwise start every job at once)."""
    import submitit  # the optional engine (the sweep extra); parse_cluster has checked that it is installed

    poll = POLL_S["slurm" if ex.cluster == "slurm" else "local"]
    results = [None] * len(kwargs_list)
    submitted = []
    try:
        for start in range(0, len(kwargs_list), wave):
            indices = range(start, min(start + wave, len(kwargs_list)))
            batch = ex.map_array(_call, [fn] * len(indices), [kwargs_list[i] for i in indices], [threads] * len(indices))
            submitted += batch
            index = {job.job_id: i for job, i in zip(batch, indices)}
            for job in submitit.helpers.as_completed(batch, poll_frequency=poll):
                i = index[job.job_id]
                results[i] = job.result()
                on_done(i, results[i])
    except BaseException:
        for job in submitted:
            if not job.done():
                job.cancel(check=False)
        raise
    return results
