"""Importing a package of ours only defines things (issue 42): no module of ``models``, ``probes``, ``cape``,
``analyses`` or ``bench`` reads the command line (``sys.argv``, ``sys.orig_argv``), reads or edits the
environment (``os.environ``, ``os.getenv``) or exits while it is imported. Checked in a fresh interpreter
whose argv and environment record every access made from a frame of our code (what torch and the other
libraries read when they load is theirs); ``import models`` alone imports no torch either."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = r"""
import importlib, json, os, pkgutil, sys
OURS = ("models", "probes", "cape", "analyses", "bench")
seen = []


def caller():
    # the first frame outside this probe and the os module: whose code made the access
    frame = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__") in ("os", "__main__"):
        frame = frame.f_back
    return "" if frame is None else frame.f_globals.get("__name__", "")


def record(what):
    name = caller()
    if name.split(".")[0] in OURS:
        seen.append(f"{name}: {what}")


class Argv(list):
    def __getitem__(self, i):
        record("reads argv")
        return list.__getitem__(self, i)

    def __iter__(self):
        record("reads argv")
        return list.__iter__(self)

    def __len__(self):
        record("reads argv")
        return list.__len__(self)

    def __contains__(self, x):
        record("reads argv")
        return list.__contains__(self, x)


class Environ(dict):
    def __getitem__(self, k):
        record(f"reads {k}")
        return dict.__getitem__(self, k)

    def get(self, k, default=None):
        record(f"reads {k}")
        return dict.get(self, k, default)

    def __contains__(self, k):
        record(f"reads {k}")
        return dict.__contains__(self, k)

    def __setitem__(self, k, v):
        record(f"sets {k}")
        dict.__setitem__(self, k, v)

    def __delitem__(self, k):
        record(f"deletes {k}")
        dict.__delitem__(self, k)

    def pop(self, k, *default):
        record(f"pops {k}")
        return dict.pop(self, k, *default)


sys.argv = Argv(["-m", "analyses.copyers", "--help"])
sys.orig_argv = Argv([sys.executable, "-m", "analyses.copyers", "--help"])  # as `python -m analyses.copyers --help` has
real = os.environ
os.environ = Environ(real)
os.environ["OMP_NUM_THREADS"] = "abc"  # malformed: an import that "fixes" it would edit the environment
seen.clear()
exits, light = [], None
try:
    import models
    light = "torch" not in sys.modules
    for package in OURS:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, package + "."):
            importlib.import_module(info.name)
except SystemExit as e:
    exits.append(repr(e.code))
os.environ = real
print(json.dumps({"seen": sorted(set(seen)), "exits": exits, "light": light}))
"""


def test_importing_our_packages_reads_no_argv_no_environment_and_never_exits():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    env.pop("OMP_NUM_THREADS", None)
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["exits"] == [], "an import exited"
    assert found["seen"] == [], found["seen"]
    assert found["light"], "import models imported torch"
