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
import re
from pathlib import Path

import torch

from models.loading import checkpoint
from models.loading.named import NAMED
from models.loading.sources import (
    catformer,
    chen,
    edelman,
    files,
    folder,
    hugging_face,
    nanogpt,
    pickled_module,
    state_dict,
    theorem1,
    transformer_lens,
)
from models.loading.sources.files import Found, Source
from models.nets.dtypes import RUN_DTYPES, dtype_name, torch_dtype
from models.plumbing import io
from models.plumbing.io import UsageError, input_errors, warn_if_models_shadowed, what_is

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
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")  # what --checkpoint names when it means the hub


def resolve(
    spec: str | Path, device: str | None = None, *, dtype: str | None = None, key_map=None, config=None, weights=True
) -> Source:
    """What ``spec`` names (see the module docstring), read once. ``dtype`` ("float32"/"float64")
    converts the weights after loading; ``key_map`` and ``config`` are for weight files;
    ``weights=False`` reads the task and layout only (``model`` is None, ``digest`` empty)."""
    warn_if_models_shadowed()  # a project's own models/ first on sys.path: say so, once
    if device is not None and weights:
        checkpoint.check_device(str(device))  # one that works here and holds values (not meta)
    spec = str(spec)
    if theorem1.detect(spec):
        options = theorem1.parse(spec)
        task = resolve(options.get("from", checkpoint.DEFAULT_CHECKPOINT), weights=False).task
        with input_errors():  # the construction's own checks of pi and beta
            return _convert(theorem1.read(spec, task, device), dtype, spec)
    path = Path(NAMED.get(spec, spec))
    if spec in NAMED and not path.exists():
        raise UsageError(f"--checkpoint {spec}: the shipped checkpoint {path} is missing from this installation")
    kind = what_is(path)
    if kind not in ("is a folder", "is a file", "does not exist"):  # a FIFO, a socket, a device, a symlink loop
        raise UsageError(f"--checkpoint {spec!r} {kind}; expected a checkpoint folder or a weight file")
    if kind == "does not exist" and not checkpoint.interrupted_write(path):
        raise UsageError(missing(spec, path))
    if kind == "is a file":
        check_weight_file(path)
    path = files.the_weight_file_in(path) or path  # nanoGPT's out/: its ckpt.pt
    found = Found(path, config=config, key_map=key_map)
    form = next(f for f in FORMATS if f.detect(found))
    with input_errors():  # the networks' and tasks' own checks of what the files hold
        source = form.read(found, device, weights=weights)
        trained_on = source.trained_on or found.trained_on() or "all"  # the format's, else the training record's
    return dataclasses.replace(_convert(source, dtype, str(path)), name=spec, trained_on=trained_on)


def missing(spec: str, path: Path) -> str:
    """The line for a ``--checkpoint`` that does not exist: what a spec may be, and for a name that looks like
    one of the Hugging Face hub's (``gpt2``, ``openai-community/gpt2``; not ``w.pt``, nor ``runs/x`` where
    ``runs/`` exists) that hub names are not fetched, and how to fetch one."""
    hub = ""
    local = Path(spec).suffix.lower() in (*WEIGHT_SUFFIXES, ".json") or (
        Path(spec).parent.name and path.parent.is_dir()
    )
    if HUB_ID.fullmatch(spec) and not local:
        hub = (
            f"; names on the Hugging Face hub are not fetched: download it (huggingface-cli download {spec} "
            f"--local-dir {Path(spec).name}), add a task.json beside its config.json and pass that folder"
        )
    return (
        f"--checkpoint {spec!r} does not exist; expected a checkpoint folder, a weight file, a shipped name "
        f"({', '.join(NAMED)}) or {theorem1.USAGE}{hub}"
    )


WEIGHT_SUFFIXES = (*files.TORCH_SUFFIXES, files.SAFETENSORS_SUFFIX, catformer.NPZ)  # and pickles, refused by name
WEIGHT_CONTAINERS = (io.ZIP, io.PICKLE, io.SAFETENSORS)  # what a weight file's first bytes may be


def check_weight_file(path: Path) -> None:
    """A file given as ``--checkpoint`` has a weight file's suffix (``WEIGHT_SUFFIXES``) and does not hold
    something else (a PNG, a PDF, a .npy: ``io.file_kind``); else one line saying what it is."""
    if path.suffix.lower() in catformer.PICKLES:
        return  # refused by the CatFormer format, with the line that exports its weights
    held = io.file_kind(path)
    if path.suffix.lower() not in WEIGHT_SUFFIXES or (held is not None and held not in WEIGHT_CONTAINERS):
        what = held or (f"a {path.suffix} file" if path.suffix else "a file without a suffix")
        raise UsageError(
            f"--checkpoint {str(path)!r} is {what}, not a weight file; expected {', '.join(WEIGHT_SUFFIXES)} "
            "(with its config and task.json beside it) or a checkpoint folder"
        )


def _convert(source: Source, dtype: str | None, where: str) -> Source:
    if dtype is None or source.model is None:
        return source
    dtype = dtype_name(dtype) or dtype  # torch.float64 as "float64"
    if dtype not in RUN_DTYPES:
        raise UsageError(f"dtype must be one of {', '.join(map(repr, RUN_DTYPES))}, got {dtype!r}")
    model = source.model.to(torch_dtype(dtype))
    bad = [n for n, t in model.state_dict().items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:  # float64 weights beyond the float32 range
        raise UsageError(f"{where}: {', '.join(bad)} overflow {dtype} (they become Inf); load them as float64")
    return dataclasses.replace(source, model=model)
