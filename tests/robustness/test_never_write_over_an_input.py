"""Never write over an input: an output path that is, or lies inside, what the command reads is refused
with one line and exit 2 before any work, and every file stays as it was."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import forked
import pytest
import torch

import models

ROOT = Path(__file__).resolve().parents[2]


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
    run = forked.run(*(a.format(ckpt=ckpt) for a in argv), cwd=tmp_path)  # python -m, the imports done once
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "which this command reads" in lines[0], run.stderr
    assert tree(tmp_path) == before


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--lr", "inf"], "--lr must be a finite number in (0, 10], got inf"),
        (["--lr", "1e300"], "--lr must be a finite number in (0, 10], got 1e+300"),
        (["--init-std", "nan"], "--init-std must be a finite number in (0, 10], got nan"),
        (["--weight-decay", "inf"], "--weight-decay must be a finite number in [0, 10], got inf"),
        (["--final-lr-fraction", "0"], "--final-lr-fraction must be a finite number in (0, 1], got 0.0"),
    ],
)
def test_standard_refuses_numbers_that_would_train_a_nan_model(tmp_path, flags, message):
    run = forked.run("models.standard", *flags, "--out", str(tmp_path / "out"), cwd=ROOT)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [f"python -m models.standard: error: {message}"]
    assert not (tmp_path / "out").exists()


def test_standard_stops_on_divergence_and_saves_nothing(tmp_path, monkeypatch):
    from models.training import standard

    descend = standard._descend

    def poisoned(loss, opt, sched):  # an update that leaves a NaN weight, as a diverging run does
        descend(loss, opt, sched)
        with torch.no_grad():
            next(p for group in opt.param_groups for p in group["params"]).fill_(float("nan"))

    monkeypatch.setattr(standard, "_descend", poisoned)
    cfg = standard.StandardConfig(
        d_model=8, n_heads=2, d_mlp=16, steps=4, eval_every=2, eval_contexts=8, batch_size=4, out=str(tmp_path / "out")
    )
    with pytest.raises(ValueError, match=r"^training diverged at step 2 \(weights .* not finite\); lower --lr$"):
        standard.train_standard(cfg, progress=False)
    assert not (tmp_path / "out").exists()
