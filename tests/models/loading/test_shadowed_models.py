"""Beside a project that has a ``models/`` of its own (first on ``sys.path`` when Python runs from that folder),
``import models`` is the project's and ``models.load_subject`` fails with AttributeError, while the suite's
submodules still load: the loaders say so in one line, once, with what to do (issue 45)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import models

ROOT = Path(models.__file__).resolve().parents[1]
LOAD_TWICE = "from models.interp.subject import load_subject; load_subject('default'); load_subject('theorem1:beta=5')"


def _python(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)  # the suite as a user has it: installed (pip install -e), not on PYTHONPATH
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # three fresh processes that import torch: about 30 s at load 9
def test_a_projects_own_models_package_is_named_in_one_line_with_what_to_do(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "__init__.py").write_text("MINE = True\n")
    shadowed = _python("-c", "import models; print(models.__file__); " + LOAD_TWICE, cwd=tmp_path)
    assert shadowed.returncode == 0, shadowed.stderr[-500:]
    assert shadowed.stdout.strip() == str(tmp_path / "models" / "__init__.py")  # the project's, as the issue found
    lines = shadowed.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"warning: the `models` package imported is {tmp_path / 'models'}, ")
    assert f"not this suite's ({ROOT / 'models'})" in lines[0] and "python -P -m" in lines[0]
    # the advice holds: with -P the current folder is not first on sys.path, and `models` is the suite's
    fixed = _python("-P", "-c", "import models; print(models.__file__); " + LOAD_TWICE, cwd=tmp_path)
    assert fixed.stdout.strip() == str(ROOT / "models" / "__init__.py") and fixed.stderr == ""


@pytest.mark.slow  # a fresh process that imports torch: about 15 s at load 9
def test_no_warning_where_models_is_the_suites(tmp_path):
    run = _python("-c", LOAD_TWICE, cwd=tmp_path)
    assert run.returncode == 0 and run.stderr == ""
