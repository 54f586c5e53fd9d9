"""Checkpoint folders: ``model.safetensors`` + ``config.json`` (+ training state apart).

``config.json`` holds the architecture (``model``), the task with pi (``task``), the training config
and seed (``training``) and library versions (``versions``). Loading reads the config, builds the
class and loads the weights: nothing is unpickled. Saving writes a temporary folder beside the target
and renames it into place, so a crash never leaves a half-written checkpoint at ``path``.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import tempfile
import uuid
from pathlib import Path

import safetensors.torch
import torch
from torch import Tensor

from models.causal_transformer import CausalTransformer, CausalTransformerConfig
from models.continuous import ContinuousTransformer

FORMAT = "causal-transformer-checkpoint/1"
CHECKPOINTS = Path(__file__).resolve().parent / "checkpoints"
DEFAULT_CHECKPOINT = CHECKPOINTS / "default"  # the shipped disentangled model (README)
STANDARD_CHECKPOINT = CHECKPOINTS / "standard"  # the shipped standard GPT-2 (models.standard)
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


def read_config(path: str | Path) -> dict:
    """The parsed ``config.json`` of a checkpoint folder, with a clear error if it is not one."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"checkpoint {path} does not exist; expected a folder with {CONFIG} and {WEIGHTS}")
    if not path.is_dir() or not (path / CONFIG).is_file():
        raise ValueError(f"checkpoint {path} has no {CONFIG}; expected a folder written by model.save")
    try:
        config = json.loads((path / CONFIG).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path / CONFIG} is not valid JSON ({e})") from None
    if not isinstance(config, dict) or "model" not in config:
        raise ValueError(f"{path / CONFIG} has no 'model' section; expected the architecture config")
    return config


def check_state_dict(state: dict[str, Tensor], model: torch.nn.Module, source: str) -> None:
    """One error listing missing, unexpected and wrongly shaped keys, and any NaN/Inf weights."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [
        f"{k}: got {tuple(state[k].shape)}, expected {expected[k]}"
        for k in sorted(set(expected) & set(state))
        if tuple(state[k].shape) != expected[k]
    ]
    problems = []
    if missing:
        problems.append("missing " + ", ".join(f"{k} {expected[k]}" for k in missing))
    if unexpected:
        problems.append("unexpected " + ", ".join(unexpected))
    if wrong:
        problems.append("wrong shape " + "; ".join(wrong))
    if problems:
        raise ValueError(f"{source} does not match the architecture: " + " | ".join(problems))
    bad = [k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise ValueError(f"{source} has NaN or Inf values in {', '.join(bad)}; expected finite weights")


def model_class(task_kind: str) -> type[CausalTransformer]:
    """The architecture for a task kind: token inputs, or real vectors (``models.continuous``)."""
    return ContinuousTransformer if task_kind == "continuous" else CausalTransformer


def load_checkpoint(path: str | Path, device: str | None = None) -> CausalTransformer:
    """Rebuild a ``CausalTransformer`` from one of our checkpoint folders (eval mode)."""
    path = Path(path)
    config = read_config(path)
    cfg_dict = dict(config["model"])
    if device is not None:
        cfg_dict["device"] = device
    cfg = CausalTransformerConfig.from_dict(cfg_dict)
    if not (path / WEIGHTS).is_file():
        raise ValueError(f"checkpoint {path} has no {WEIGHTS}")
    try:
        state = safetensors.torch.load_file(path / WEIGHTS, device=cfg.device)
    except Exception as e:  # safetensors raises its own error types for truncated/corrupt files
        raise ValueError(f"{path / WEIGHTS} is not a readable safetensors file ({e})") from None
    model = model_class((config.get("task") or {}).get("kind", "markov_tree"))(cfg)
    check_state_dict(state, model, str(path / WEIGHTS))
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
) -> None:
    """Write a checkpoint folder atomically. ``task`` is a ``probes.MarkovTreeTask``."""
    config = {
        "format": FORMAT,
        "model": model.cfg.to_dict(),
        "task": None if task is None else task.to_dict(),
        "training": training,
        "versions": versions(),
    }

    def write(folder: Path) -> None:
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        safetensors.torch.save_file(state, folder / WEIGHTS)
        (folder / CONFIG).write_text(json.dumps(config, indent=1) + "\n")
        if train_state is not None:
            safetensors.torch.save_file(
                {k: v.detach().cpu().contiguous() for k, v in train_state.items()}, folder / TRAIN_STATE
            )
            (folder / TRAIN_META).write_text(json.dumps(train_meta or {}, indent=1) + "\n")

    write_folder_atomically(path, write)


def write_folder_atomically(path: str | Path, write) -> None:
    """Call ``write(tmp_folder)``, then move the folder to ``path``, replacing a previous checkpoint.

    Refuses to replace an existing folder that is not a checkpoint (no config.json) unless empty.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{path} exists and is not a folder; refusing to overwrite it")
    if path.is_dir() and any(path.iterdir()) and not (path / CONFIG).is_file():
        raise ValueError(f"{path} exists and is not a checkpoint folder; refusing to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; give it ordinary permissions
        for f in tmp.iterdir():
            f.chmod(0o666 & ~umask)
        if path.exists():
            old = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:8]}"
            path.rename(old)
            # Replace the checkpoint's own files only: anything else in the folder (a training run's
            # snapshots/) moves into the new one instead of being deleted with the old.
            for entry in old.iterdir():
                if entry.name not in (WEIGHTS, CONFIG, TRAIN_STATE, TRAIN_META) and not (tmp / entry.name).exists():
                    entry.rename(tmp / entry.name)
            tmp.rename(path)
            shutil.rmtree(old)
        else:
            tmp.rename(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def checkpoint_hash(path: str | Path) -> str:
    """sha256 of the weights and config of a checkpoint folder (first 16 hex digits)."""
    h = hashlib.sha256()
    for name in (WEIGHTS, CONFIG):
        h.update((Path(path) / name).read_bytes())
    return h.hexdigest()[:16]
