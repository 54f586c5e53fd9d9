"""Short training runs for the analyses that watch training: the training config a checkpoint was trained
with (``training_config``), a short run of it with snapshots (``train_short_run``) and a run's snapshot
folders in step order (``find_snapshots``). Used by ``analyses.block_structure``, ``analyses.trajectory``
and ``analyses.bma_agreement``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import models
from models.loading.checkpoint import read_config
from models.plumbing.io import UsageError
from models.training.train import TrainConfig, train


def find_snapshots(folder: str | Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``step_XXXXXX`` snapshot under ``folder`` or ``folder/snapshots``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UsageError(
            f"--snapshots {folder} is not a folder; expected a run folder of models.train --snapshot-every N"
        )
    base = folder / "snapshots" if (folder / "snapshots").is_dir() else folder
    found = []
    for p in base.iterdir():
        if p.is_dir() and p.name.startswith("step_") and p.name[5:].isdigit():
            found.append((int(p.name[5:]), p))
    if not found:
        raise UsageError(f"no step_XXXXXX snapshot folders in {base}; write them with models.train --snapshot-every N")
    return sorted(found)


def training_config(checkpoint: str):
    """The ``TrainConfig`` a ``--checkpoint`` was trained with (the shipped one's for 'default' and for a
    Theorem 1 subject, which has no training of its own)."""
    source = (
        models.DEFAULT_CHECKPOINT if checkpoint == "default" or checkpoint.startswith("theorem1") else Path(checkpoint)
    )
    saved = (read_config(source).get("training") or {}).get("config") or {}
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    return TrainConfig(**{k: v for k, v in saved.items() if k in known})


def train_short_run(folder: Path, checkpoint: str, steps: int, every: int, seed: int) -> Path:
    """Train ``steps`` steps of the checkpoint's training config with snapshots every ``every`` steps
    into ``folder``; returns the run folder."""
    cfg = dataclasses.replace(
        training_config(checkpoint),
        steps=steps,
        snapshot_every=every,
        eval_every=every,
        eval_contexts=256,
        seed=seed,
        out=str(folder / "run"),
        resume=False,
    )
    train(cfg, progress=False)
    return folder / "run"
