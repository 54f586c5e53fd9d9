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

    Args:
        path: what ``--checkpoint`` takes: a named checkpoint (``"default"``, ``"standard"``;
            ``models.DEFAULT_CHECKPOINT``), a checkpoint folder, a Hugging Face folder with a ``task.json``, a
            nanoGPT ``ckpt.pt``, a TransformerLens or plain state dict, or ``theorem1:beta=B`` (the formats:
            ``docs/howto/load.md``).
        device: where to put the weights (``"cpu"``, ``"cuda"``; default: the CPU).
        dtype: ``"float32"`` or ``"float64"``: convert the weights after loading (default: as stored).
        key_map (dict | str | Path | None): for a weight file in our parameterisation with other key names:
            the file's names -> ours, each optionally transposed, reshaped, padded or placed
            (``models.loading.sources.key_map``).
        config (dict | str | Path | None): for a bare weight file: our ``config.json`` or a ``task.json`` (a path
            or a dict).

    Returns:
        model (torch.nn.Module): the model, in eval mode, with TransformerLens hook names (``run_with_cache``,
            ``hooks``).

    Raises:
        ValueError: a path that does not exist or is no known format, missing or wrongly shaped weights, a
            config that does not cover the weights, NaN weights: one line that says what was expected.
    """
    return resolve(path, device, dtype=dtype, key_map=key_map, config=config).model


def load_task(path: str | Path, config=None) -> MarkovTreeTask | ContinuousTask:
    """The task the model at ``path`` was trained on (``config.json``'s ``task``, or a task.json). Reads no weights.

    Args:
        path: what ``--checkpoint`` takes: a named checkpoint (``"default"``, ``"standard"``;
            ``models.DEFAULT_CHECKPOINT``), a checkpoint folder, a Hugging Face folder with a ``task.json``, a
            nanoGPT ``ckpt.pt``, a TransformerLens or plain state dict, or ``theorem1:beta=B`` (the formats:
            ``docs/howto/load.md``).
        config (dict | str | Path | None): for a bare weight file: the ``config.json`` or ``task.json`` that holds
            its task.

    Returns:
        The task (``probes.MarkovTreeTask``, a ``probes.GraphTask`` of the family, or the continuous task):
        its kernel ``pi``, sizes and ``sample(batch, generator)``.

    Raises:
        ValueError: no task found beside the model, or one that is malformed, in one line.
    """
    return resolve(path, config=config, weights=False).task


def load_layout(path: str | Path, config=None) -> Layout:
    """Where the model at ``path`` reads the task's tokens (our folders: the task's own layout). Reads no
    weights.

    Args:
        path: what ``--checkpoint`` takes: a named checkpoint (``"default"``, ``"standard"``;
            ``models.DEFAULT_CHECKPOINT``), a checkpoint folder, a Hugging Face folder with a ``task.json``, a
            nanoGPT ``ckpt.pt``, a TransformerLens or plain state dict, or ``theorem1:beta=B`` (the formats:
            ``docs/howto/load.md``).
        config (dict | str | Path | None): for a bare weight file: the ``config.json`` or ``task.json`` beside it.

    Returns:
        The ``probes.Layout``: BOS, separators and id offset (task.json's ``layout``; none: the plain layout).
    """
    return resolve(path, config=config, weights=False).layout
