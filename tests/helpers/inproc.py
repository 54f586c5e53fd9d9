"""``python -m MODULE ARGV`` run in this process: what ``forked.run`` returns, without a process.

A rule about bad input (exit code, one line on stderr, nothing written) is a property of the entry point's
code, not of a process: here it is checked against the module itself, run as ``python -m`` runs it
(``runpy.run_module`` as ``__main__``, ``sys.argv`` set, the working folder and environment given), with
its ``SystemExit`` caught and its stdout and stderr captured. What only a process can show (an address-space
limit, a kill, a lock held by another process, a reader that goes away) stays with
``forked.run``, once per entry point. This process's state is as it was afterwards: working folder,
environment, ``sys.argv``, torch's thread count and every random generator.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
from forked import ROOT, Completed, as_main


@contextlib.contextmanager
def _restored(cwd: Path, env: dict | None):
    """Enter ``cwd`` with ``env`` as the environment; afterwards, everything a run may change, as it was."""
    before = os.getcwd(), dict(os.environ), list(sys.argv), torch.get_num_threads()
    states = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    os.chdir(cwd)
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    try:
        yield
    finally:
        os.chdir(before[0])
        os.environ.clear()
        os.environ.update(before[1])
        sys.argv[:] = before[2]
        torch.set_num_threads(before[3])
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.random.set_rng_state(states[2])


def run(module: str, *argv: str, cwd: Path, env: dict | None = None) -> Completed:
    """``python -m module argv`` in this process, in folder ``cwd`` with the environment ``env`` (default:
    this one's): its exit code (that of ``SystemExit``; 1 and a traceback on stderr for any other
    exception, as the interpreter reports it), stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with _restored(cwd, env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        with warnings.catch_warnings():  # runpy's note that the module was imported before: it was, here
            warnings.filterwarnings("ignore", message=".*found in sys.modules", category=RuntimeWarning)
            code = as_main(module, list(argv))
    return Completed([module, *argv], code, out.getvalue(), err.getvalue())


def analysis(name: str, checkpoint: str | Path, out: str | Path, *extra: str) -> Completed:
    """``python -m analyses.NAME --checkpoint CHECKPOINT --out OUT EXTRA`` in this process, from the repository."""
    return run(f"analyses.{name}", "--checkpoint", str(checkpoint), "--out", str(out), *extra, cwd=ROOT)
