"""One way in: ``models.load(path)`` for every model the suite reads, ``models.load_task(path)`` for the
task it was trained on, ``models.load_layout(path)`` for where its input ids hold that task's tokens.
Each is one read of ``models.loading.sources.resolve`` (the formats: ``models.loading.sources.FORMATS``)."""

from __future__ import annotations

from pathlib import Path

from models.loading.sources import resolve
from probes import MarkovTreeTask
from probes.continuous import ContinuousTask
from probes.layout import Layout


def load(path: str | Path, device: str | None = None, *, dtype: str | None = None, key_map=None, config=None):
    """The model at ``path`` in eval mode: a ``CausalTransformer`` from our folders and weight files, or
    a hooked standard transformer (``TransformerBridge``, ...) from other pipelines' formats.
    ``dtype`` ("float32"/"float64") converts the weights after loading."""
    return resolve(path, device, dtype=dtype, key_map=key_map, config=config).model


def load_task(path: str | Path, config=None) -> MarkovTreeTask | ContinuousTask:
    """The task the model at ``path`` was trained on (``config.json``'s ``task``, or a task.json)."""
    return resolve(path, config=config, weights=False).task


def load_layout(path: str | Path, config=None) -> Layout:
    """Where the model at ``path`` reads the task's tokens (our folders: the task's own layout)."""
    return resolve(path, config=config, weights=False).layout
