"""Checkpoints written by a real TransformerLens 2.x/3.x release (``tests/models/loading/data/write_transformer_lens.py``, run
in a subprocess under that release) load with that release's own log-probabilities.

Opt-in: those releases cannot be installed beside TransformerLens 4, so the test runs only when
``TL_RELEASE_DIRS`` lists (``os.pathsep``-separated) folders holding unpacked release wheels, e.g.
``TL_RELEASE_DIRS=/tmp/tl218:/tmp/tl39`` (see the script's docstring for how to make one)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from models.loading.loading import load

DIRS = [d for d in os.environ.get("TL_RELEASE_DIRS", "").split(os.pathsep) if d]
WRITER = Path(__file__).parent / "data" / "write_transformer_lens.py"


@pytest.mark.skipif(not DIRS, reason="TL_RELEASE_DIRS names no TransformerLens 2.x/3.x release")
@pytest.mark.parametrize("release", DIRS)
def test_files_written_by_a_real_transformer_lens_release_load_with_its_numbers(tmp_path, release):
    env = {**os.environ, "PYTHONPATH": release}
    run = subprocess.run([sys.executable, str(WRITER), str(tmp_path)], env=env, capture_output=True, text=True)
    assert run.returncode == 0, f"{release} could not write: {run.stderr.strip().splitlines()[-1:]}"
    folders = sorted(tmp_path.iterdir())
    assert len(folders) == 9
    for folder in folders:
        ref = torch.load(folder / "reference.pt", weights_only=True)
        model = load(folder / "model.pt")
        with torch.no_grad():
            got = model(ref["ids"]).log_softmax(-1).double()
        tol = 1e-12 if ref["logp"].dtype == torch.float64 and "f64" in folder.name else 1e-5
        assert (got - ref["logp"]).abs().max() < tol, folder.name
