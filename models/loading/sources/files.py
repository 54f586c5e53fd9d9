"""What every format reads: the path given, with ``--config`` and ``--key-map``, each file read once.

``Found`` is handed to every format's ``detect`` and ``read``: small files (configs, task.json, key
maps) are read through ``models.plumbing.io.read_small`` once and kept; a weight file's contents
(``torch.load(weights_only=True)``: nothing is unpickled beyond tensors, dicts, lists, numbers and
strings; or safetensors) are read once and kept. The plumbing the formats share sits here too.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import warnings
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import safetensors.torch
import torch
from torch import Tensor

from models.loading.checkpoint import CONFIG, OTHER, folder_kind
from models.loading.dtypes import check_tensor_kinds
from models.loading.sources.key_map import read_key_map
from models.plumbing import io
from models.plumbing.io import UsageError
from probes.layout import Layout

TORCH_SUFFIXES = (".pt", ".pth", ".bin")
SAFETENSORS_SUFFIX = ".safetensors"
TASK_JSON = "task.json"
LOSSES = ("all", "target", "last")  # models.training.standard.LOSSES: what the trainers write as loss_on
TRAINING_JSON = "training.json"  # the suite's trainers' record beside the weights (config, loss_on, history)
PREFIXES = ("_orig_mod.", "module.")
HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin")  # a Hugging Face folder's weights, in from_pretrained's order
HASH_CHUNK = 2**20


@dataclass(frozen=True)
class Source:
    """A model resolved from what ``--checkpoint`` names: the model (None when only the task was asked
    for), its task, the ``Layout`` of its input ids, the name it was given, a digest of everything read
    (16 hex digits), and the format that read it."""

    model: object
    task: object
    layout: Layout
    name: str
    digest: str
    format: str
    trained_on: str | None = None  # probes.metrics.POSITIONS its loss used (None: not known to the format; resolve)


class Found:
    """``path`` (a file or a folder) with the ``config`` and ``key_map`` given for it (a dict, a JSON
    path or None). Every file is read at most once (``text``, ``json``, ``archive``)."""

    def __init__(self, path: str | Path, config=None, key_map=None):
        self.path, self.config, self.key_map = Path(path), config, key_map
        self._bytes: dict[Path, bytes] = {}

    def __repr__(self) -> str:
        return f"Found({str(self.path)!r})"

    @property
    def where(self) -> str:
        return str(self.path)

    @property
    def beside(self) -> Path:
        """The folder the weights sit in: the path itself, or the file's folder."""
        return self.path if self.path.is_dir() else self.path.parent

    def bytes(self, file: Path, what: str) -> bytes:
        """The bytes of a small file, read once (``models.plumbing.io.read_small``)."""
        file = Path(file)
        if file not in self._bytes:
            self._bytes[file] = io.read_small(file, what)
        return self._bytes[file]

    def json(self, file: Path, what: str):
        """A small JSON file, parsed (read once)."""
        return io.parse_json(self.bytes(file, what), file, what)

    def json_arg(self, value, what: str):
        """A dict given directly (``config=``, ``key_map=``), or the parsed JSON file it names."""
        return value if isinstance(value, dict) else self.json(Path(value), what)

    def config_candidates(self) -> list[Path]:
        """Where a weight file's config may sit when ``--config`` is not given, in order."""
        return [self.path.with_suffix(".json"), self.path.parent / CONFIG, self.path.parent / TASK_JSON]

    @cached_property
    def config_file(self) -> Path | None:
        """``--config`` if given as a path, else the first candidate that exists (None: none)."""
        if self.config is not None:
            return None if isinstance(self.config, dict) else Path(self.config)
        return next((c for c in self.config_candidates() if c.is_file()), None)

    def model_config(self):
        """The weight file's config: ``--config``, else the first candidate beside it; else one line."""
        if self.config is None and self.config_file is None:
            tried = ", ".join(str(t) for t in self.config_candidates())
            raise UsageError(
                f"{self.path} needs a config: pass --config (a checkpoint config.json, a TransformerLens "
                f"cfg.to_dict() JSON or a task.json); none found at {tried}"
            )
        return self.json_arg(self.config if self.config is not None else self.config_file, "config")

    def task_json_beside(self, kind: str):
        """(raw task, where): the task.json beside a language model's weights."""
        file = self.beside / TASK_JSON
        if not file.is_file():
            raise UsageError(
                f"{self.path} is a {kind} model; its task (and layout) must be in {file}, which does not exist"
            )
        return self.json(file, "task.json"), str(file)

    def trained_on(self) -> str | None:
        """The positions its training loss used, from the training.json beside the weights (``loss_on`` at its
        top or in its ``config``, as the suite's trainers write it): ``last`` for the last token only, ``all``
        for any other loss; None when there is no such record."""
        file = self.beside / TRAINING_JSON
        if not file.is_file():
            return None
        record = self.json(file, "training.json")
        if not isinstance(record, dict):
            raise UsageError(f"{file}: training.json holds a JSON {type(record).__name__}; expected an object with "
                             "loss_on (or a config holding it)")  # fmt: skip
        config = record.get("config")
        loss_on = record.get("loss_on", config.get("loss_on") if isinstance(config, dict) else None)
        if loss_on is None:
            return None
        if not isinstance(loss_on, str) or loss_on.lower() not in LOSSES:
            raise UsageError(f"{file}: training.json: loss_on must be one of {', '.join(LOSSES)}, got {loss_on!r}")
        return "last" if loss_on.lower() == "last" else "all"  # a loss on the target's tokens: every position

    def key_map_spec(self) -> dict[str, dict]:
        """The validated key map (``models.loading.sources.key_map``); {} when none was given."""
        return read_key_map(None if self.key_map is None else self.json_arg(self.key_map, "key map"))

    @cached_property
    def archive(self):
        """The contents of the weight file (see the module docstring)."""
        return read_archive(self.path)

    def state_dict(self, obj=None) -> dict[str, Tensor]:
        """The state dict in the weight file (or in ``obj``), unwrapped from ``state_dict``/``model``."""
        return as_state_dict(self.archive if obj is None else obj, self.path)

    def digest(self) -> str:
        """sha256 (16 hex digits) of what defines the model and nothing else (``defining_files``: a large
        unrelated file beside the weights is never read), the config and the key map. Weight files are
        hashed in chunks, never held whole."""
        h = hashlib.sha256()
        path = self.path
        for f in self.defining_files():
            h.update(f.name.encode())
            if f.name.endswith(".json"):
                h.update(self.bytes(f, "file"))
            else:
                with open(f, "rb") as stream:
                    while chunk := stream.read(HASH_CHUNK):
                        h.update(chunk)
        if not path.is_dir() and (self.config is not None or self.config_file is not None):
            h.update(json.dumps(self.model_config()).encode())
        if self.key_map is not None:
            h.update(json.dumps(self.json_arg(self.key_map, "key map")).encode())
        return h.hexdigest()[:16]

    def defining_files(self) -> list[Path]:
        """The files that define the model, sorted by name: a weight file and the task.json beside it; a
        Hugging Face folder's config.json, task.json and the weight files ``from_pretrained`` reads."""
        if not self.path.is_dir():
            task = self.path.parent / TASK_JSON
            return [self.path, *([task] if task.is_file() else [])]
        files = [self.path / CONFIG, self.path / TASK_JSON, *hf_weight_files(self.path, self.json)]
        return sorted((f for f in files if f.is_file()), key=lambda f: f.name)


def hf_weight_files(folder: Path, read_json) -> list[Path]:
    """The weight files of a Hugging Face folder, as ``from_pretrained`` looks for them: ``model.safetensors``,
    else the shards its ``.index.json`` names (the index included), else the same for ``pytorch_model.bin``.
    ``read_json(file, what)`` parses the index."""
    for name in HF_WEIGHTS:
        if (folder / name).is_file():
            return [folder / name]
        index = folder / f"{name}.index.json"
        if index.is_file():
            weight_map = read_json(index, "weight index")
            shards = weight_map.get("weight_map", {}) if isinstance(weight_map, dict) else {}
            if not isinstance(shards, dict):
                raise UsageError(f"{index}: weight_map must be a JSON object {{tensor name: shard file}}")
            return [index, *(folder / Path(str(shard)).name for shard in sorted(set(shards.values())))]
    return []


def weight_files_in(folder: Path) -> list[Path]:
    """The torch and safetensors weight files directly in ``folder``, sorted by name."""
    suffixes = (*TORCH_SUFFIXES, SAFETENSORS_SUFFIX)
    return sorted(f for f in folder.iterdir() if f.suffix.lower() in suffixes and f.is_file())


def the_weight_file_in(folder: Path) -> Path | None:
    """The one weight file of a folder that does not define itself (no ``config.json`` of ours or of Hugging
    Face, no Hugging Face weights): nanoGPT's ``out/`` holding ``ckpt.pt``, a TransformerLens ``w.pt`` beside
    its config. None for any other folder (one that defines itself, or holds none or several)."""
    if not folder.is_dir() or hf_weight_files(folder, lambda f, w: {}):  # ours and Hugging Face's: model.safetensors
        return None
    found = weight_files_in(folder)
    return found[0] if len(found) == 1 and folder_kind(folder) == OTHER else None


def check_not_a_weight_file_folder(folder: Path, what: str) -> None:
    """A folder read as ``what`` that lacks its own files (no ``config.json``, or a ``config.json`` that is
    not ``what``'s) but holds a weight file (a nanoGPT ``ckpt.pt``, a TransformerLens state dict): a
    ``ValueError`` naming the file to pass instead. Nothing if the folder holds no weight file."""
    if not folder.is_dir() or hf_weight_files(folder, lambda f, w: {}):
        return
    files = weight_files_in(folder)
    if files:
        more = f" (or {io.listing([f.name for f in files[1:]])})" if len(files) > 1 else ""
        raise UsageError(
            f"{str(folder)!r} is not {what} but holds the weight file {files[0].name!r}{more}: pass the file "
            f"itself, --checkpoint {str(files[0])!r} (nanoGPT's ckpt.pt and TransformerLens state dicts are read "
            "from the file, with task.json beside it)"
        )


def is_torch_file(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in TORCH_SUFFIXES


def torch_state_dict_with(found: Found, *keys: str) -> bool:
    """Whether ``found`` is a torch file whose state dict (bare, or under ``state_dict`` / ``model``) holds
    every one of ``keys``: how a peer's checkpoint, saved with its own parameter names, is recognised."""
    if not is_torch_file(found.path):
        return False
    obj = found.archive
    obj = obj.get("state_dict", obj.get("model", obj)) if isinstance(obj, dict) else obj
    return isinstance(obj, dict) and all(k in obj for k in keys)


def _torch_load(path: Path, **kw):
    with warnings.catch_warnings():  # torch's notice on its own storage API (quantized tensors) is not for users
        warnings.filterwarnings("ignore", message="TypedStorage is deprecated")
        return torch.load(path, map_location="cpu", weights_only=True, **kw)


def read_archive(path: Path):
    """The contents of a .pt/.pth/.bin (``weights_only=True``) or .safetensors file, sized before it is
    read (its bytes against the memory available: a memory-mapped .pt is touched whole by the checks and
    copies that follow, a key map's included); any name the shell allows (``io.openable``)."""
    suffix = path.suffix.lower()
    if suffix not in (*TORCH_SUFFIXES, SAFETENSORS_SUFFIX):
        raise UsageError(
            f"{path}: unknown weight format {suffix!r}; expected one of "
            f"{', '.join(TORCH_SUFFIXES + (SAFETENSORS_SUFFIX,))}, or a checkpoint folder"
        )
    io.check_memory(path.stat().st_size, f"reading {path}")
    with io.openable(path) as name:
        return _read_torch(name, path) if suffix in TORCH_SUFFIXES else _read_safetensors(name, path)


def _read_torch(name: Path, path: Path):
    try:
        try:  # memory-mapped: tensors are read when used
            return _torch_load(name, mmap=True)
        except RuntimeError as e:
            if "mmap" not in str(e):
                raise
            return _torch_load(name)  # legacy (non-zip) format
    except pickle.UnpicklingError as e:
        blocked = [line.strip() for line in str(e).splitlines() if "GLOBAL" in line]
        if not blocked:  # not a pickle at all
            raise UsageError(f"{path} is not a readable PyTorch file (not a state-dict archive)") from None
        raise UsageError(
            f"{path} is not a plain state dict: refusing to unpickle it, it would load code ({blocked[0][:160]})"
        ) from None
    except Exception as e:  # truncated or corrupt archives raise RuntimeError, EOFError, ...
        raise UsageError(f"{path} is not a readable PyTorch file ({io.one_line(e)})") from None


def _read_safetensors(name: Path, path: Path):
    try:
        return safetensors.torch.load_file(name)
    except Exception as e:
        raise UsageError(f"{path} is not a readable safetensors file ({io.one_line(e)})") from None


def as_state_dict(obj, path: Path) -> dict[str, Tensor]:
    for wrapper in ("state_dict", "model"):
        if isinstance(obj, dict) and isinstance(obj.get(wrapper), dict):
            obj = obj[wrapper]
            break
    if not isinstance(obj, dict) or not obj:
        raise UsageError(f"{path} holds a {type(obj).__name__}, not a state dict; expected {{name: tensor}}")
    bad = [str(k) for k, v in obj.items() if not isinstance(k, str) or not isinstance(v, Tensor)]
    if bad:
        raise UsageError(f"{path}: entries {', '.join(bad[:5])} are not named tensors; expected {{name: tensor}}")
    check_copied_size(obj, path)
    return dict(obj)


def check_copied_size(state: dict[str, Tensor], path: Path) -> None:
    """The tensors of ``state`` sized as what they become once copied (numel x element size: a broadcast or
    stride-0 tensor of a few stored bytes counts whole), against the memory available, before any is
    touched; one line naming the file and the largest tensor, its shape and its stored bytes."""
    sizes = {k: v.numel() * v.element_size() for k, v in state.items()}
    if not sizes:
        return
    big = max(sizes, key=sizes.__getitem__)
    stored = state[big].untyped_storage().nbytes() if state[big].device.type != "meta" else 0
    io.check_memory(
        sum(sizes.values()),
        f"{path}: its tensors, copied (the largest, {big!r} {list(state[big].shape)}, holds {io.size(stored)} "
        "in the file),",
    )


def load_their_names(model, state: dict[str, Tensor], their_key, where: str, *, skip=()) -> None:
    """Load ``state``, keyed by a peer's names (``their_key(ours) -> theirs``), into ``model``: one line
    naming the unknown or missing keys or the first misshapen one; ``skip``: our keys checked elsewhere."""
    ours = {their_key(k): k for k in model.state_dict() if k not in skip}
    unknown, absent = sorted(set(state) - set(ours)), sorted(set(ours) - set(state))
    if unknown or absent:
        raise UsageError(f"{where}: keys {unknown[:3]} are not the model's; missing {absent[:3]}")
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    bad = [k for k, v in state.items() if tuple(v.shape) != shapes[ours[k]]]
    if bad:
        raise UsageError(
            f"{where}: {bad[0]} has shape {tuple(state[bad[0]].shape)}, the model's {shapes[ours[bad[0]]]}"
        )
    check_tensor_kinds(state, where)  # before .float(): a complex or integer tensor is refused, not cast
    model.load_state_dict({ours[k]: v.float() for k, v in state.items()}, strict=not skip)


def strip_prefixes(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Remove leading ``_orig_mod.`` / ``module.`` (in any order, repeated) from every key."""
    out = {}
    for key, value in state.items():
        new = key
        while new.startswith(PREFIXES):
            new = new.split(".", 1)[1]
        if new in out:
            raise UsageError(f"keys {key!r} and another both become {new!r} after stripping {PREFIXES}")
        out[new] = value
    return out


def shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def check_fits(layout: Layout, vocab: int, n_ctx: int | None, where: str) -> None:
    """A language model must hold every id the layout uses and every position it needs."""
    if vocab < layout.min_vocab:
        raise UsageError(
            f"{where}: model vocab_size={vocab} disagrees with the task (d_vocab={layout.d_vocab}, layout "
            f"{layout.to_json()}): it needs at least {layout.min_vocab} ids"
        )
    if n_ctx is not None and n_ctx < layout.n_positions:
        raise UsageError(
            f"{where}: the model has {n_ctx} positions; the layout {layout.to_json()} needs {layout.n_positions} "
            f"((L+1)H = {(layout.n_examples + 1) * layout.seq_len} task tokens plus BOS and separators)"
        )


def no_file_options(found: Found, what: str) -> None:
    """A folder that defines itself takes neither ``--key-map`` nor ``--config``."""
    if found.key_map is not None or found.config is not None:
        raise UsageError(f"{found.path} is {what}; --key-map and --config apply to weight files only")
