"""The ways in: ``resolve(spec)`` reads what ``--checkpoint`` names once and returns the model, its task,
the ``Layout`` of its input ids, its name and a digest together (a ``Source``). ``models.load``,
``models.load_task``, ``models.load_layout`` and ``models.load_subject`` are reads of it.

A spec is a named checkpoint (``NAMED``: ``default``, ``standard``), ``theorem1:beta=B[,from=FOLDER]``
(``models.loading.sources.theorem1``), or a path. A path is read by the first format in ``FORMATS`` whose
``detect(found)`` is true; each format is one module here with ``NAME``, ``detect(found) -> bool`` and
``read(found, device, *, weights) -> Source`` (``weights=False``: the task and layout only, no weights
read). ``found`` (``models.loading.sources.files.Found``) reads every file once; task.json is read and validated
in ``models.loading.sources.task_json``, key maps in ``models.loading.sources.key_map``.

A new format is one new module beside these and one line in ``FORMATS`` (before the formats whose
``detect`` would also take its files: ``state_dict`` takes every weight file, ``folder`` every path
that is left). Nothing is unpickled beyond tensors, dicts, lists, numbers and strings; nothing is written.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from models.loading import checkpoint
from models.loading.dtypes import DTYPES, RUN_DTYPES
from models.loading.sources import (
    catformer,
    chen,
    edelman,
    folder,
    hugging_face,
    nanogpt,
    pickled_module,
    state_dict,
    theorem1,
    transformer_lens,
)
from models.loading.sources.files import Found, Source
from models.plumbing.io import what_is

__all__ = ["FORMATS", "NAMED", "Source", "resolve"]

# The formats, in the order they are tried: the first whose detect(found) holds reads the path.
FORMATS = [
    hugging_face,  # a folder with config.json + weights + task.json
    pickled_module,  # torch.save(model) of an nn.Module: refused, saying what to save
    catformer,  # Nichani et al.'s CatFormer pytree: .npz of its leaves or a pickle of NumPy arrays
    nanogpt,  # ckpt.pt with model + model_args
    chen,  # Chen et al.'s TwoLayerTransformer state dict (layer1.W, layer2.C_alpha_list)
    edelman,  # Edelman et al.'s Relative_Transformer state dict (layers.{i}.wpe), their config.json beside
    transformer_lens,  # a state dict whose config is a TransformerLens cfg.to_dict()
    state_dict,  # any other weight file: our parameterisation, with a key map
    folder,  # what is left: one of our checkpoint folders
]
NAMED = {"default": checkpoint.DEFAULT_CHECKPOINT, "standard": checkpoint.STANDARD_CHECKPOINT}


def resolve(
    spec: str | Path, device: str | None = None, *, dtype: str | None = None, key_map=None, config=None, weights=True
) -> Source:
    """What ``spec`` names (see the module docstring), read once. ``dtype`` ("float32"/"float64")
    converts the weights after loading; ``key_map`` and ``config`` are for weight files;
    ``weights=False`` reads the task and layout only (``model`` is None, ``digest`` empty)."""
    spec = str(spec)
    if theorem1.detect(spec):
        options = theorem1.parse(spec)
        task = resolve(options.get("from", checkpoint.DEFAULT_CHECKPOINT), weights=False).task
        return _convert(theorem1.read(spec, task, device), dtype, spec)
    path = Path(NAMED.get(spec, spec))
    if spec in NAMED and not path.exists():
        raise ValueError(f"--checkpoint {spec}: the shipped checkpoint {path} is missing from this installation")
    kind = what_is(path)
    if kind not in ("is a folder", "is a file", "does not exist"):  # a FIFO, a socket, a device, a symlink loop
        raise ValueError(f"--checkpoint {spec!r} {kind}; expected a checkpoint folder or a weight file")
    found = Found(path, config=config, key_map=key_map)
    form = next(f for f in FORMATS if f.detect(found))
    source = form.read(found, device, weights=weights)
    trained_on = source.trained_on or found.trained_on() or "all"  # the format's, else the training record's
    return dataclasses.replace(_convert(source, dtype, str(path)), name=spec, trained_on=trained_on)


def _convert(source: Source, dtype: str | None, where: str) -> Source:
    if dtype is None or source.model is None:
        return source
    if dtype not in RUN_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(map(repr, RUN_DTYPES))}, got {dtype!r}")
    model = source.model.to(DTYPES[dtype])
    bad = [n for n, t in model.state_dict().items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:  # float64 weights beyond the float32 range
        raise ValueError(f"{where}: {', '.join(bad)} overflow {dtype} (they become Inf); load them as float64")
    return dataclasses.replace(source, model=model)
