"""``python -m MODULE ARGV`` in a new process without paying the imports each time.

The robustness catalogues run each command in a process of its own under an address-space limit: a
refusal must come before anything is allocated, and a bug that builds the model must be stopped by the
limit, not by this machine's memory. Started as ``python -m``, every such process spends about 3 s of CPU
importing torch, transformers and the suite before the one line it is tested for. Here the processes are
forked from a server (multiprocessing's ``forkserver``) that has imported those once and run nothing else
(no torch thread pool exists to be inherited by a fork): each case gets a process of its own, its own
address space under ``RLIMIT_AS`` (counting what the imports mapped, as a fresh process's does), its own
working folder, environment and stdio, in about 0.1 s. The command runs as ``python -m`` runs it
(``runpy.run_module`` as ``__main__``, ``sys.argv`` set), or as ``python -c CODE`` runs CODE (module
``"-c"``, the code first in argv); its exit code is that of ``SystemExit``, 1 for an uncaught exception (its
traceback on stderr), as in Python. ``run`` waits for it; ``start`` returns the process (to kill it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import resource
import runpy
import signal
import sys
import tempfile
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The bound on a hang, for every test that must bound one. It is no timing test: the cases it guards take
# seconds alone, but the suite must pass on a slow machine under load (beside a second copy of itself on
# 2 cores a 40 s case took over 60 s), so the bound is ten minutes, far above any case's run time.
HANG_S = 600
# What the commands import, here once rather than in each child: besides the suite, what they import lazily
# (torch._dynamo and sympy at the first optimizer step or model load, about 1.3 s of CPU a child; a standard
# model's TransformerLens bridge and GPT-2; seaborn and the PDF backend of a figure)
PRELOAD = ["torch", "transformers", "transformer_lens", "matplotlib.pyplot", "models", "analyses.common", "torch._dynamo",
           "transformer_lens.model_bridge", "transformers.models.gpt2.modeling_gpt2", "seaborn",
           "matplotlib.backends.backend_pdf"]  # fmt: skip


@dataclasses.dataclass
class Completed:
    """What ``subprocess.run(capture_output=True, text=True)`` returns, as far as the tests read it."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str


def _context():
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


CONTEXT = _context()


def _child(module: str, argv: list[str], cwd: str, env: dict, limit: int | None, out: str, err: str) -> None:
    """In the forked process: stdio to files, the limit, the folder, the environment; then the module."""
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_TRUNC)
        os.dup2(f, fd)
        os.close(f)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 (the process ends with os._exit)
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    if limit is not None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    sys.path.insert(0, cwd if module != "-c" else "")  # as python -m puts the working folder first (-c: "")
    sys.modules.pop(module, None)  # run afresh as __main__, as python -m does (no warning that it was imported)
    code = as_main(module, argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def as_main(module: str, argv: list[str]) -> int:
    """Run ``python -m module argv`` (module ``"-c"``: ``python -c argv[0] argv[1:]``) in this process, with
    ``sys.argv`` set: the exit code the interpreter would give (that of ``SystemExit``; 1 and the traceback on
    stderr for an uncaught exception)."""
    sys.argv = [module, *argv] if module != "-c" else ["-c", *argv[1:]]
    try:
        if module == "-c":
            exec(compile(argv[0], "<string>", "exec"), {"__name__": "__main__"})
        else:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 (as the interpreter reports an uncaught exception)
        traceback.print_exc()
        return 1
    return 0


@contextlib.contextmanager
def bounded(seconds: int = HANG_S):
    """Fail (instead of hanging) if the block takes more than ``seconds`` (main thread only: SIGALRM)."""

    def expire(signum, frame):
        raise TimeoutError(f"over {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def start(module: str, *argv: str, cwd: Path, env: dict | None = None, limit: int | None = None,
          stdout: str = os.devnull, stderr: str = os.devnull) -> multiprocessing.Process:  # fmt: skip
    """``python -m module argv`` started in a forked process (``run``'s arguments; its stdout and stderr to
    the files named): the process, running (``.pid``, ``.join()``, ``.exitcode``)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)} if env is None else env
    p = CONTEXT.Process(target=_child, args=(module, list(argv), str(cwd), env, limit, stdout, stderr))
    p.start()
    return p


def run(module: str, *argv: str, cwd: Path, env: dict | None = None, limit: int | None = None,
        timeout: float = HANG_S) -> Completed:  # fmt: skip
    """``python -m module argv`` in a forked process with working folder ``cwd``, the environment ``env``
    (default: this one's, with the repository on ``PYTHONPATH``), address space ``limit`` bytes, and
    ``timeout`` seconds (then killed; ``TimeoutError``)."""
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        out.touch()
        err.touch()
        p = start(module, *argv, cwd=cwd, env=env, limit=limit, stdout=str(out), stderr=str(err))
        p.join(timeout)
        if p.exitcode is None:
            p.kill()
            p.join()
            raise TimeoutError(f"python -m {module} {' '.join(argv)} ran past {timeout} s")
        # a path that is not UTF-8 prints as its own bytes: read back as the same str
        text = [f.read_text(errors="surrogateescape") for f in (out, err)]
        return Completed([module, *argv], p.exitcode, *text)
