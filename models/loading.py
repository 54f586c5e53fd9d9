"""One way in: ``models.load(path)`` for every model the suite reads, ``models.load_task(path)`` for the
task it was trained on, ``models.load_layout(path)`` for where its input ids hold that task's tokens.

Our own checkpoint folders are ``models.checkpoint``; anything else (weight files with a key map, Hugging
Face folders, other pipelines' checkpoints) is ``models.formats``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from models import checkpoint, formats
from probes import MarkovTreeTask
from probes.continuous import ContinuousTask
from probes.layout import Layout


def load(path: str | Path, device: str | None = None, *, dtype: str | None = None, key_map=None, config=None):
    """The model at ``path`` in eval mode: a ``CausalTransformer`` from our folders and weight files, or
    a hooked standard transformer (``TransformerBridge``, ...) from other pipelines' formats.
    ``dtype`` ("float32"/"float64") converts the weights after loading."""
    path = Path(path)
    if formats.is_foreign(path):
        model = formats.load_foreign(path, device, key_map=key_map, config=config)
    elif key_map is not None or config is not None:
        raise ValueError(
            f"{path} is one of our checkpoint folders: its config.json defines it; --key-map and --config "
            f"apply to weight files only"
        )
    else:
        model = checkpoint.load_checkpoint(path, device)
    if dtype is not None:
        if dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
        model = model.to(getattr(torch, dtype))
        bad = [n for n, t in model.state_dict().items() if t.is_floating_point() and not torch.isfinite(t).all()]
        if bad:  # float64 weights beyond the float32 range
            raise ValueError(f"{path}: {', '.join(bad)} overflow {dtype} (they become Inf); load them as float64")
    return model


def load_task(path: str | Path, config=None) -> MarkovTreeTask | ContinuousTask:
    """The task the model at ``path`` was trained on (``config.json``'s ``task``, or a task.json)."""
    path = Path(path)
    if formats.is_foreign(path):
        return formats.load_foreign_task(path, config)
    raw = checkpoint.read_config(path).get("task")
    if not isinstance(raw, dict):
        raise ValueError(f"{path / checkpoint.CONFIG} has no task section; save checkpoints with models.save(..., task=)")
    if raw.get("kind") == "continuous":
        return ContinuousTask.from_dict(raw)
    return formats.task_from_dict(raw, str(path / checkpoint.CONFIG))


def load_layout(path: str | Path, config=None) -> Layout:
    """Where the model at ``path`` reads the task's tokens (our folders: the task's own layout)."""
    path = Path(path)
    if formats.is_foreign(path) and hasattr(formats, "load_foreign_layout"):
        return formats.load_foreign_layout(path, config)
    task = load_task(path, config)
    return Layout(task.n_examples, task.seq_len, task.d_vocab)
