"""Checkpoint folders: ``model.safetensors`` + ``config.json`` (+ training state apart).

``config.json`` holds the architecture (``model``), the task with pi (``task``), the training config
and seed (``training``) and library versions (``versions``). Loading reads the config, builds the
class and loads the weights: nothing is unpickled. Saving writes a new folder beside the target and
exchanges it with the old one in one step (``write_folder_atomically``), so a crash or kill at any
instant leaves the old checkpoint or the new one at ``path``, whole.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import hashlib
import json
import os
import platform
import shutil
from pathlib import Path

import safetensors
import safetensors.torch
import torch
from torch import Tensor

from models.loading.dtypes import check_tensor_kinds
from models.loading.named import CHECKPOINTS, DEFAULT_CHECKPOINT, STANDARD_CHECKPOINT  # noqa: F401 (also read from here)
from models.nets.build import build, model_bytes  # noqa: F401 (model_bytes: also read from here)
from models.nets.causal_transformer import CausalTransformer, CausalTransformerConfig
from models.nets.continuous import ContinuousTransformer
from models.plumbing.io import (
    UsageError,
    exclusive_lock,
    name_too_long,
    one_line,
    openable,
    read_json,
    what_is,
)
from probes.tasks import check_sizes

FORMAT = "causal-transformer-checkpoint/1"
CONFIG, WEIGHTS = "config.json", "model.safetensors"
TRAIN_STATE, TRAIN_META = "train_state.safetensors", "train_state.json"


def versions() -> dict:
    from importlib.metadata import version

    import transformer_lens  # noqa: F401  (version lookup only)

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformer_lens": version("transformer-lens"),
        "safetensors": version("safetensors"),
    }


def read_config(path: str | Path, read=read_json) -> dict:
    """The parsed, validated ``config.json`` of a checkpoint folder: a ``model`` section (a JSON object)
    and a ``task`` section whose sizes agree with it. One ``ValueError`` if it is not one. ``read(file,
    what)`` parses a JSON file (``models.loading.sources`` passes its reader, which reads each file once)."""
    path = Path(path)
    long = name_too_long(path)
    if long is not None:
        raise UsageError(f"checkpoint {str(path)!r}: the name {long[:40]!r}... is over 255 bytes")
    if not path.exists():
        hint = ""
        if _old(path).is_dir():
            hint = f"; an interrupted write left {_old(path).name!r} beside it: the next write to it restores it"
        raise UsageError(
            f"checkpoint {str(path)!r} {what_is(path)}; expected a folder with {CONFIG} and {WEIGHTS}{hint}"
        )
    if not path.is_dir() or not (path / CONFIG).is_file():
        raise UsageError(f"checkpoint {str(path)!r} has no {CONFIG}; expected a folder written by models.save")
    config = read(path / CONFIG, "checkpoint config")
    where = str(path / CONFIG)
    if isinstance(config, dict) and ("model_type" in config or "architectures" in config):
        raise UsageError(
            f"{str(path)!r} is a Hugging Face folder (config.json has model_type {config.get('model_type')!r}) "
            f"without task.json; add a task.json beside config.json naming the task it was trained on "
            f"(README: Loading other formats)"
        )
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        raise UsageError(f"{where!r} has no 'model' section (a JSON object); expected the architecture config")
    task = config.get("task")
    if not isinstance(task, dict):
        raise UsageError(f"{where!r} has no task section; save checkpoints with models.save(model, path, task=...)")
    check_task_fits(config["model"], task, where)
    return config


def check_task_fits(model_cfg: dict, task: dict, where: str) -> None:
    """The task's d_vocab, n_examples and seq_len are integers within bounds, equal to the model's."""
    least = 0 if task.get("kind") == "graph" else 1  # the family's tasks may have no demonstration
    model_sizes = check_sizes(*(model_cfg.get(k) for k in SIZES), where=f"{where}: model", min_examples=least)
    if task.get("kind", "markov_tree") == "markov_tree" and "d_vocab" not in task and isinstance(task.get("pi"), list):
        task = {**task, "d_vocab": len(task["pi"])}
    task_sizes = check_sizes(*(task.get(k) for k in SIZES), where=f"{where}: task", min_examples=least)
    for field, m, t in zip(SIZES, model_sizes, task_sizes):
        if m != t:
            raise UsageError(f"{where!r}: the task's {field}={t} disagrees with the model's {field}={m}")


SIZES = ("d_vocab", "n_examples", "seq_len")


def check_state_dict(state: dict[str, Tensor], model: torch.nn.Module, source: str) -> None:
    """One error listing missing, unexpected and wrongly shaped keys, and any NaN/Inf weights (values
    that overflow the model's dtype included). ``state`` values may be tensors or shapes (tuples)."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    shapes = {k: tuple(v.shape) if isinstance(v, Tensor) else tuple(v) for k, v in state.items()}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [
        f"{k}: got {shapes[k]}, expected {expected[k]}"
        for k in sorted(set(expected) & set(state))
        if shapes[k] != expected[k]
    ]
    problems = []
    if missing:
        problems.append("missing " + ", ".join(f"{k} {expected[k]}" for k in missing))
    if unexpected:
        problems.append("unexpected " + ", ".join(unexpected))
    if wrong:
        problems.append("wrong shape " + "; ".join(wrong))
    if problems:
        raise UsageError(f"{source} does not match the architecture: " + " | ".join(problems))
    tensors = {k: v for k, v in state.items() if isinstance(v, Tensor)}
    check_tensor_kinds(tensors, source)
    bad = [k for k, v in tensors.items() if not torch.isfinite(v).all()]
    if bad:
        raise UsageError(f"{source} has NaN or Inf values in {', '.join(bad)}; expected finite weights")
    dtype = next(iter(model.state_dict().values())).dtype
    big = [k for k, v in tensors.items() if v.numel() and v.abs().max().item() > torch.finfo(dtype).max]
    if big:
        raise UsageError(
            f"{source}: {', '.join(big)} hold values beyond the {str(dtype).replace('torch.', '')} range "
            f"(max {torch.finfo(dtype).max:.3g}); they would become Inf"
        )


def check_device(device: str) -> str:
    """``device`` names a torch device that works here (a tensor can be put on it); else one line."""
    if not isinstance(device, str):
        raise UsageError(f"device must be a string such as 'cpu' or 'cuda:0', got {device!r}")
    try:
        torch.device(device)
    except (RuntimeError, ValueError):
        raise UsageError(f"device {device!r} is not a torch device (expected cpu, cuda, cuda:0, ...)") from None
    if torch.device(device).type == "meta":
        raise UsageError(f"device {device!r} holds no values (only shapes); expected a device that computes: cpu, cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"device {device!r}: CUDA is not available on this machine; use cpu")
    try:
        torch.zeros(1, device=device)
    except Exception as e:  # a device this build of torch cannot use (mps, xla, cuda:7, ...)
        raise UsageError(f"device {device!r} cannot be used on this machine ({one_line(e)[:120]})") from None
    return device


def model_class(task_kind: str) -> type[CausalTransformer]:
    """The architecture for a task kind: token inputs, or real vectors (``models.nets.continuous``)."""
    return ContinuousTransformer if task_kind == "continuous" else CausalTransformer


def load_checkpoint(path: str | Path, device: str | None = None, config: dict | None = None) -> CausalTransformer:
    """Rebuild a ``CausalTransformer`` from one of our checkpoint folders (eval mode). The config
    (``read_config``'s, read here unless given) is validated and the file's tensor shapes compared with
    it before anything is allocated."""
    path = Path(path)
    config = read_config(path) if config is None else config
    cfg_dict = dict(config["model"])
    if device is not None:
        cfg_dict["device"] = device
    cfg = CausalTransformerConfig.from_dict(cfg_dict)
    check_device(cfg.device)
    if not (path / WEIGHTS).is_file():
        raise UsageError(f"checkpoint {str(path)!r} has no {WEIGHTS}")
    cls = model_class(config["task"].get("kind", "markov_tree"))
    where = str(path / WEIGHTS)
    with openable(path / WEIGHTS) as name:  # any name the shell allows
        try:
            with safetensors.safe_open(name, "pt") as f:
                shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        except Exception as e:  # safetensors raises its own error types for truncated/corrupt files
            raise UsageError(f"{where!r} is not a readable safetensors file ({one_line(e)})") from None
        with torch.device("meta"):
            check_state_dict(shapes, cls(dataclasses.replace(cfg, device="meta")), where)
        model = build(cls, cfg, f"the model of {str(path)!r}")
        try:
            state = safetensors.torch.load_file(name)  # on the CPU: a bad --device is not the file's fault
        except Exception as e:
            raise UsageError(f"{where!r} is not a readable safetensors file ({one_line(e)})") from None
    check_state_dict(state, model, where)
    model.load_state_dict({k: v.to(cfg.torch_dtype) for k, v in state.items()})
    return model.eval()


def save(
    model: CausalTransformer,
    path: str | Path,
    *,
    task=None,
    training: dict | None = None,
    train_state: dict[str, Tensor] | None = None,
    train_meta: dict | None = None,
    carry: bool = True,
) -> None:
    """Write a checkpoint folder atomically: ``model.safetensors``, ``config.json`` (the model's config, the
    task, the training record, library versions) and, if given, the training state apart. A reader never sees a
    half-written folder: the new one replaces the old by one exchange.

    Args:
        model: the model to save.
        path: the checkpoint folder; an existing one is replaced (``models.train`` refuses without
            ``--overwrite``).
        task (MarkovTreeTask | ContinuousTask): the task the model reads (required: every reader needs it),
            matching the model's sizes.
        training: the training record (config, seed, evaluation history) for ``config.json``.
        train_state: optimizer and RNG tensors for ``--resume``, written beside the weights.
        train_meta: what ``train_state`` needs besides tensors (step, ...).
        carry: the previous folder's other entries (a run's snapshots/) move into the new one; False: they go
            with the previous folder, once the new one is in place (a run started afresh).

    Raises:
        ValueError: no ``task``, a task that does not fit the model, or a ``path`` that cannot be replaced.
    """
    check_replaceable(Path(path))
    if task is None or not hasattr(task, "to_dict"):
        raise UsageError(f"models.save({str(path)!r}) needs task=: the task the model reads (every CLI loads it)")
    config = {
        "format": FORMAT,
        "model": model.cfg.to_dict(),
        "task": task.to_dict(),
        "training": training,
        "versions": versions(),
    }
    check_task_fits(config["model"], config["task"], f"models.save({str(path)!r})")

    def write(folder: Path) -> None:
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        safetensors.torch.save_file(state, folder / WEIGHTS)
        (folder / CONFIG).write_text(json.dumps(config, indent=1) + "\n")
        if train_state is not None:
            safetensors.torch.save_file(
                {k: v.detach().cpu().contiguous() for k, v in train_state.items()}, folder / TRAIN_STATE
            )
            (folder / TRAIN_META).write_text(json.dumps(train_meta or {}, indent=1) + "\n")

    write_folder_atomically(path, write, carry=carry)


# The atomic folder write ---------------------------------------------------------------------------
# Siblings of ``path``, fixed names (one writer at a time: the lock): ``.NAME.new`` is being written,
# ``.NAME.old`` (only where the file system cannot exchange two folders) is the previous folder while
# the new one is renamed into place, ``.NAME.lock`` is the lock. ``recover`` reads them to finish or undo
# an interrupted write; the write itself calls it first.
REPLACES = ".replaces-extras"  # in a new folder written with carry=False: recovery carries nothing into it
OWN_FILES = (WEIGHTS, CONFIG, TRAIN_STATE, TRAIN_META, REPLACES)


def interrupted_write(path: str | Path) -> bool:
    """Whether a write to ``path`` was killed between its two renames (``.NAME.old`` is left beside it)."""
    return _old(Path(path)).is_dir()


def _new(path: Path) -> Path:
    return path.parent / f".{path.name}.new"


def _old(path: Path) -> Path:
    return path.parent / f".{path.name}.old"


def _lock(path: Path) -> Path:
    return path.parent / f".{path.name}.lock"


def _exchange(a: Path, b: Path) -> bool:
    """Swap two folders in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    if _RENAMEAT2 is None:
        return False
    if _RENAMEAT2(-100, os.fsencode(a), -100, os.fsencode(b), 2) == 0:  # AT_FDCWD, RENAME_EXCHANGE
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), str(a))


def _libc_renameat2():
    with contextlib.suppress(OSError, AttributeError):
        return ctypes.CDLL(None, use_errno=True).renameat2
    return None


_RENAMEAT2 = _libc_renameat2()


def _carry_extras(source: Path, target: Path) -> None:
    """Move what is not a checkpoint file of ours (a training run's snapshots/) from ``source`` into
    ``target``, where ``target`` has no entry of that name: it survives the replacement."""
    for entry in sorted(source.iterdir()):
        if entry.name not in OWN_FILES and not (target / entry.name).exists():
            os.rename(entry, target / entry.name)


def _recover(path: Path) -> None:
    """Finish or undo an interrupted write (caller holds the lock). Every state it can meet:
    ``path`` missing and ``.old`` present (killed between the two renames): the old folder comes back,
    with what ``.new`` had carried; ``.new`` present (killed while writing, while carrying, or after the
    exchange, when ``.new`` holds the previous checkpoint's files): extras go back to ``path``, and
    ``.new`` is removed; ``.old`` beside ``path`` (killed while removing it): removed."""
    new, old = _new(path), _old(path)
    if not path.exists() and old.is_dir():
        if new.is_dir():
            _carry_extras(new, old)
        os.rename(old, path)
    if new.is_dir():
        if path.is_dir() and not (path / REPLACES).exists():
            _carry_extras(new, path)
        shutil.rmtree(new)
    if old.is_dir():
        shutil.rmtree(old)
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        (path / REPLACES).unlink()


SNAPSHOTS = "snapshots"  # a run's snapshots/step_XXXXXX/ folders (models.train, models.standard)


def snapshot_folder(out: str | Path, step: int) -> Path:
    """Where a run at ``out`` keeps its snapshot of step ``step``."""
    return Path(out) / SNAPSHOTS / f"step_{step:06d}"


def recover(path: str | Path) -> None:
    """Restore ``path`` after a write to it was killed part-way, and remove the write's leftovers (a
    lock file a killed writer left included)."""
    path = Path(path)
    if path.parent.is_dir() and any(p.exists() for p in (_new(path), _old(path), _lock(path))):
        with exclusive_lock(_lock(path), what=repr(str(path))):
            _recover(path)


def recover_run(out: str | Path) -> None:
    """``recover`` a run's folder and every snapshot under its snapshots/ (a kill inside a snapshot's
    write leaves its ``.step_XXXXXX.new`` and ``.lock`` there, not beside ``out``)."""
    out = Path(out)
    recover(out)
    snapshots = out / SNAPSHOTS
    if snapshots.is_dir():
        names = {
            e.name[1:].rsplit(".", 1)[0] for e in snapshots.iterdir() if e.name.endswith((".new", ".old", ".lock"))
        }
        for name in sorted(names):
            recover(snapshots / name)


def training_lock(out: Path) -> Path:
    """The lock a training holds on its ``--out`` for its whole run (beside it: the folder is replaced)."""
    return out.parent / f".{out.name}.train.lock"


def resolved_out(out: str | Path) -> Path:
    """``out``, or where it points if it is a symlink: a write replaces the target folder, never the link."""
    out = Path(out)
    return Path(os.path.realpath(out)) if out.is_symlink() else out


OURS, HUGGING_FACE, OTHER = "checkpoint folder of ours", "Hugging Face folder", "folder that is not a checkpoint"


def folder_kind(path: Path) -> str | None:
    """What the folder ``path`` holds, read from its config.json: None (absent or empty), ``OURS`` (a
    ``model`` section), ``HUGGING_FACE`` (``model_type`` or ``architectures``), else ``OTHER``."""
    if not path.is_dir() or not any(path.iterdir()):
        return None
    try:
        config = read_json(path / CONFIG, "config")
    except ValueError:
        return OTHER
    if isinstance(config, dict) and ("model_type" in config or "architectures" in config):
        return HUGGING_FACE
    return OURS if isinstance(config, dict) and isinstance(config.get("model"), dict) else OTHER


def check_replaceable(path: Path, kind: str = OURS) -> None:
    """``path`` is absent, an empty folder, or a folder of ``kind``: a write never replaces a file, a
    folder that is not a checkpoint, or another format's checkpoint."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{str(path)!r} exists and is not a folder; refusing to overwrite it")
    found = folder_kind(path)
    if found == OTHER:
        raise UsageError(f"{str(path)!r} exists and is not a checkpoint folder; refusing to overwrite it")
    if found not in (None, kind):
        raise UsageError(
            f"{str(path)!r} holds a {found}; refusing to replace it with a {kind} (another format's checkpoint "
            "is never replaced): pick another folder, or remove it first"
        )


def write_folder_atomically(path: str | Path, write, kind: str = OURS, carry: bool = True) -> None:
    """Call ``write(folder)`` on a fresh folder, then put it at ``path`` in one step, replacing a previous
    checkpoint there (whose other entries, e.g. snapshots/, move into the new one).

    A crash or kill at any instant leaves at ``path`` either the previous folder or the new one, whole:
    the two are exchanged atomically (``renameat2``); where the file system cannot, the previous folder
    is renamed to ``.NAME.old`` for the instant between two renames, and ``recover`` (called by the next
    write, and by training at its start) puts it back. Writers of one ``path`` take turns (a lock).
    Refuses to replace an existing folder that is not empty and not a checkpoint of ``kind``. ``carry``
    False: the previous folder's other entries are removed with it, after the new one is in place. A
    symlink at ``path`` stays: the folder it points to is replaced."""
    path = resolved_out(path)
    check_replaceable(path, kind)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create the folder {str(path.parent)!r} ({e.strerror or e})") from None
    new, old = _new(path), _old(path)
    with exclusive_lock(_lock(path), what=repr(str(path))):
        _recover(path)
        check_replaceable(path, kind)
        new.mkdir()
        try:
            write(new)
            if not carry:
                (new / REPLACES).touch()
            _sync_folder(new)
            if not path.exists():
                os.rename(new, path)
            else:
                if carry:
                    _carry_extras(path, new)
                if not _exchange(new, path):
                    os.rename(path, old)
                    os.rename(new, path)
                    new = old
                shutil.rmtree(new)
            with contextlib.suppress(FileNotFoundError):
                (path / REPLACES).unlink()
            _sync(path.parent)
        except BaseException:
            with contextlib.suppress(Exception):
                _recover(path)
            raise


def _sync_folder(folder: Path) -> None:
    """Flush the files of ``folder`` and the folder itself to disk (a power cut keeps them whole)."""
    for f in folder.iterdir():
        if f.is_file():
            _sync(f)
    _sync(folder)


def _sync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def checkpoint_hash(path: str | Path, read_config_bytes=None) -> str:
    """sha256 of the weights and config of a checkpoint folder (first 16 hex digits);
    ``read_config_bytes(file, what)`` reads config.json (default: from disk)."""
    h = hashlib.sha256()
    h.update((Path(path) / WEIGHTS).read_bytes())
    h.update(
        (Path(path) / CONFIG).read_bytes()
        if read_config_bytes is None
        else read_config_bytes(Path(path) / CONFIG, "checkpoint config")
    )
    return h.hexdigest()[:16]
