"""Never write over an input: an output path that is, or lies inside, what the command reads is refused
with one line and exit 2 before any work, and every file stays as it was."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import models

ROOT = Path(__file__).resolve().parent.parent


def tree(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


@pytest.mark.parametrize(
    "argv",
    [
        ["models.evaluate", "--checkpoint", "{ckpt}", "--json", "{ckpt}/config.json"],
        ["models.evaluate", "--checkpoint", "{ckpt}", "--json", "{ckpt}/new.json"],
        ["analyses.copyers", "--checkpoint", "{ckpt}", "--out", "{ckpt}"],
        ["analyses.copyers", "--checkpoint", "{ckpt}", "--out", "{ckpt}/figs"],
    ],
)
def test_an_output_inside_the_checkpoint_read_is_refused(tmp_path, argv):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(models.DEFAULT_CHECKPOINT, ckpt)
    before = tree(tmp_path)
    run = subprocess.run(
        [sys.executable, "-m", *(a.format(ckpt=ckpt) for a in argv)], cwd=tmp_path, capture_output=True, text=True
    )
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "which this command reads" in lines[0], run.stderr
    assert tree(tmp_path) == before
