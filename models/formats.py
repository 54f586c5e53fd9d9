"""Loading models saved by other pipelines: ``models.load(path)`` dispatches here for anything that is
not one of our checkpoint folders.

Supported paths
- ``*.pt``, ``*.pth``, ``*.bin``: a plain PyTorch state dict of the ``CausalTransformer`` architecture,
  read with ``torch.load(weights_only=True)`` only (a pickle that would run code is refused). A dict
  wrapping it under ``state_dict`` / ``model`` is unwrapped; ``_orig_mod.`` (torch.compile) and
  ``module.`` (DataParallel/DDP) prefixes are stripped.
- ``*.safetensors``: the same state dict as a bare safetensors file.
- A Hugging Face causal-LM folder (``config.json`` + weights) with a ``task.json`` beside them: loaded
  offline through ``transformer_lens.TransformerBridge`` (see ``models.standard``).

Files need a config: ``config=`` (``--config`` on the CLIs), else ``<file stem>.json``, ``config.json``
or ``task.json`` beside the file. It is either a checkpoint ``config.json`` of ours (sections ``model``
and ``task``) or a bare task.json (then K = ``n_copy_heads`` if given, else L).

Key map (``key_map=`` / ``--key-map map.json``): names in the file (after prefix stripping) -> our names,
optionally with a transpose (of two dims; ``true`` means the last two) and then a reshape::

    {"copy.pos":  "blocks.0.attn.w_H",
     "copy.demo": {"to": "blocks.0.attn.w_L", "reshape": [10, 11]},
     "select.W":  {"to": "blocks.1.attn.W_KQ", "transpose": true},
     "select.V":  "blocks.1.attn.W_OV",
     "root":      "b_root"}

Keys the map does not name keep their name.

task.json schema (beside a Hugging Face folder; also accepted as the config of a file)::

    {"kind": "markov_tree",            # the only task kind supported
     "d_vocab": 5,                     # d, the model's vocabulary (token ids 0..d-1)
     "n_examples": 6, "seq_len": 8,    # L demonstrations and H tokens per sequence
     "pi": [[...], ...],               # d x d row-stochastic kernel, pi[a][b] = pi(b | a)
     "root": [...],                    # optional distribution of x_1 (default uniform)
     "layout": "example-major: ..."}   # flat index l*H + h, l = L is the target; the only layout

For the Hugging Face model the logits at flat position p predict token p + 1 (the ordinary shift).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from pathlib import Path

import safetensors.torch
import torch
from torch import Tensor

from models.causal_transformer import CausalTransformer, CausalTransformerConfig
from models.checkpoint import CONFIG, check_state_dict
from probes.tasks import MarkovTreeTask

TORCH_SUFFIXES = (".pt", ".pth", ".bin")
SAFETENSORS_SUFFIX = ".safetensors"
TASK_JSON = "task.json"
PREFIXES = ("_orig_mod.", "module.")
LAYOUT = "example-major"


def is_foreign(path: str | Path) -> bool:
    """True for paths this module loads: a weight file, or a Hugging Face folder with a task.json."""
    path = Path(path)
    return path.is_file() or (path.is_dir() and (path / TASK_JSON).is_file())


def load_foreign(path: str | Path, device: str | None = None, *, key_map=None, config=None):
    """A ``CausalTransformer`` from a weight file, or a ``TransformerBridge`` from a Hugging Face folder."""
    path = Path(path)
    if path.is_dir():
        if key_map is not None or config is not None:
            raise ValueError(
                f"{path} is a Hugging Face folder: its config.json and task.json define it; "
                f"--key-map and --config apply to weight files only"
            )
        return load_hf(path, device)
    state = read_weights(path)
    state = apply_key_map(strip_prefixes(state), read_key_map(key_map))
    cfg_dict, _ = read_file_config(path, config)
    if device is not None:
        cfg_dict["device"] = device
    model = CausalTransformer(CausalTransformerConfig.from_dict(cfg_dict))
    check_state_dict(state, model, str(path))
    model.load_state_dict({k: v.to(model.cfg.torch_dtype) for k, v in state.items()})
    return model.eval()


def load_foreign_task(path: str | Path, config=None) -> MarkovTreeTask:
    """The task of a foreign model: task.json of a Hugging Face folder, or the config of a file."""
    path = Path(path)
    if path.is_dir():
        return read_task_json(path / TASK_JSON)
    return read_file_config(path, config)[1]


def foreign_hash(path: str | Path, key_map=None, config=None) -> str:
    """sha256 (16 hex digits) of the weights, the config and the key map that define a foreign model."""
    path = Path(path)
    h = hashlib.sha256()
    files = sorted(f for f in path.iterdir() if f.is_file()) if path.is_dir() else [path]
    for f in files:
        h.update(f.name.encode() + f.read_bytes())
    if not path.is_dir():
        h.update(
            json.dumps(
                _json_arg(config, "config", path) if config is not None else _read_json(_find_config(path), "config")
            ).encode()
        )
    if key_map is not None:
        h.update(json.dumps(_json_arg(key_map, "key map")).encode())
    return h.hexdigest()[:16]


# Weight files ---------------------------------------------------------------------------------------
def read_weights(path: Path) -> dict[str, Tensor]:
    """The tensors of a .pt/.pth/.bin (``weights_only=True``) or .safetensors file."""
    suffix = path.suffix.lower()
    if suffix in TORCH_SUFFIXES:
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            blocked = [line.strip() for line in str(e).splitlines() if "GLOBAL" in line]
            if not blocked:  # not a pickle at all
                raise ValueError(f"{path} is not a readable PyTorch file (not a state-dict archive)") from None
            raise ValueError(
                f"{path} is not a plain state dict: refusing to unpickle it, it would load code ({blocked[0][:160]})"
            ) from None
        except Exception as e:  # truncated or corrupt archives raise RuntimeError, EOFError, ...
            raise ValueError(f"{path} is not a readable PyTorch file ({_first_line(e)})") from None
        return _as_state_dict(obj, path)
    if suffix == SAFETENSORS_SUFFIX:
        try:
            return safetensors.torch.load_file(path)
        except Exception as e:
            raise ValueError(f"{path} is not a readable safetensors file ({_first_line(e)})") from None
    raise ValueError(
        f"{path}: unknown weight format {suffix!r}; expected one of "
        f"{', '.join(TORCH_SUFFIXES + (SAFETENSORS_SUFFIX,))}, or a checkpoint folder"
    )


def _as_state_dict(obj, path: Path) -> dict[str, Tensor]:
    for wrapper in ("state_dict", "model"):
        if isinstance(obj, dict) and isinstance(obj.get(wrapper), dict):
            obj = obj[wrapper]
            break
    if not isinstance(obj, dict) or not obj:
        raise ValueError(f"{path} holds a {type(obj).__name__}, not a state dict; expected {{name: tensor}}")
    bad = [str(k) for k, v in obj.items() if not isinstance(k, str) or not isinstance(v, Tensor)]
    if bad:
        raise ValueError(f"{path}: entries {', '.join(bad[:5])} are not named tensors; expected {{name: tensor}}")
    return dict(obj)


def strip_prefixes(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Remove leading ``_orig_mod.`` / ``module.`` (in any order, repeated) from every key."""
    out = {}
    for key, value in state.items():
        new = key
        while new.startswith(PREFIXES):
            new = new.split(".", 1)[1]
        if new in out:
            raise ValueError(f"keys {key!r} and another both become {new!r} after stripping {PREFIXES}")
        out[new] = value
    return out


# Key maps -------------------------------------------------------------------------------------------
def read_key_map(key_map) -> dict[str, dict]:
    """Validate a key map (a dict or a JSON path) into ``{source: {"to", "transpose", "reshape"}}``."""
    if key_map is None:
        return {}
    raw = _json_arg(key_map, "key map")
    if not isinstance(raw, dict):
        raise ValueError(
            f"key map must be a JSON object {{file key: our key or {{to, transpose, reshape}}}}, "
            f"got {type(raw).__name__}"
        )
    spec = {}
    for src, entry in raw.items():
        entry = {"to": entry} if isinstance(entry, str) else entry
        if not isinstance(entry, dict) or not isinstance(entry.get("to"), str):
            raise ValueError(f"key map entry {src!r} must be a key name or an object with a 'to' name")
        unknown = set(entry) - {"to", "transpose", "reshape"}
        if unknown:
            raise ValueError(
                f"key map entry {src!r} has unknown fields {sorted(unknown)}; expected to, transpose, reshape"
            )
        t = entry.get("transpose", False)
        if not (isinstance(t, bool) or (isinstance(t, list) and len(t) == 2 and all(isinstance(i, int) for i in t))):
            raise ValueError(f"key map entry {src!r}: transpose must be true/false or two dims, got {t!r}")
        r = entry.get("reshape")
        if r is not None and not (
            isinstance(r, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in r)
        ):
            raise ValueError(f"key map entry {src!r}: reshape must be a list of ints, got {r!r}")
        spec[src] = {"to": entry["to"], "transpose": t, "reshape": r}
    return spec


def apply_key_map(state: dict[str, Tensor], spec: dict[str, dict]) -> dict[str, Tensor]:
    """Rename, transpose and reshape as ``spec`` says; every key it names must be in ``state``."""
    absent = sorted(set(spec) - set(state))
    if absent:
        raise ValueError(f"key map names {', '.join(absent)}, not in the file (it has {', '.join(sorted(state))})")
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        entry = spec.get(key)
        if entry is not None:
            value = _transform(key, value, entry)
            key = entry["to"]
        if key in out:
            raise ValueError(f"key map sends two tensors to {key!r}")
        out[key] = value
    return out


def _transform(key: str, value: Tensor, entry: dict) -> Tensor:
    t, r = entry["transpose"], entry["reshape"]
    if t is not False:
        dims = (-2, -1) if t is True else tuple(t)
        if value.ndim < 2 or not all(-value.ndim <= i < value.ndim for i in dims):
            raise ValueError(f"key map cannot transpose {key!r} of shape {tuple(value.shape)} over dims {dims}")
        value = value.transpose(*dims)
    if r is not None:
        try:
            value = value.reshape(r)
        except RuntimeError:
            raise ValueError(f"key map cannot reshape {key!r} of shape {tuple(value.shape)} to {r}") from None
    return value.contiguous()


# Configs and task.json ------------------------------------------------------------------------------
def read_file_config(path: Path, config=None) -> tuple[dict, MarkovTreeTask]:
    """(model config dict, task) for a weight file; checks that the two agree."""
    where = config if config is not None else _find_config(path)
    raw = _json_arg(where, "config", path)
    if not isinstance(raw, dict):
        raise ValueError(f"config {where} must be a JSON object with 'model' and 'task', or a task.json")
    if "model" in raw:
        if not isinstance(raw.get("task"), dict):
            raise ValueError(f"config {where} has a 'model' section but no 'task'; expected both")
        model_cfg, task = dict(raw["model"]), task_from_dict(raw["task"], str(where))
    else:
        task = task_from_dict(raw, str(where))
        model_cfg = {
            "d_vocab": task.d_vocab,
            "n_examples": task.n_examples,
            "seq_len": task.seq_len,
            "n_copy_heads": raw.get("n_copy_heads"),
        }
    for field, value in (("d_vocab", task.d_vocab), ("n_examples", task.n_examples), ("seq_len", task.seq_len)):
        if model_cfg.get(field) != value:
            raise ValueError(f"config {where}: model {field}={model_cfg.get(field)} disagrees with the task's {value}")
    return model_cfg, task


def _find_config(path: Path) -> Path:
    tried = [path.with_suffix(".json"), path.parent / CONFIG, path.parent / TASK_JSON]
    for candidate in tried:
        if candidate.is_file():
            return candidate
    raise ValueError(
        f"{path} needs a config: pass --config (a checkpoint config.json or a task.json); "
        f"none found at {', '.join(str(t) for t in tried)}"
    )


def read_task_json(path: str | Path) -> MarkovTreeTask:
    """Parse and validate a task.json (schema in the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path} does not exist; a Hugging Face folder needs a task.json beside its weights")
    return task_from_dict(_read_json(path, "task.json"), str(path))


def task_from_dict(raw, where: str) -> MarkovTreeTask:
    """A ``MarkovTreeTask`` from the task.json schema, with errors that name the file and the field."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: task must be a JSON object, got {type(raw).__name__}")
    if raw.get("kind", "markov_tree") != "markov_tree":
        raise ValueError(f"{where}: task kind {raw.get('kind')!r} is not supported; expected 'markov_tree'")
    layout = raw.get("layout", LAYOUT)
    if not isinstance(layout, str) or not layout.startswith(LAYOUT):
        raise ValueError(f"{where}: layout {layout!r} is not supported; expected '{LAYOUT}' (flat index l*H + h)")
    for field in ("n_examples", "seq_len", "d_vocab"):
        value = raw.get(field)
        if field in raw and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{where}: {field} must be a positive integer, got {value!r}")
    try:
        return MarkovTreeTask.from_dict(raw)
    except (TypeError, RuntimeError) as e:  # e.g. a ragged pi list
        raise ValueError(f"{where}: malformed task ({_first_line(e)})") from None
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _json_arg(value, what: str, beside: Path | None = None):
    """A dict given directly, or the parsed JSON file it names."""
    if isinstance(value, dict):
        return value
    return _read_json(Path(value), what)


def _read_json(path: Path, what: str):
    if not path.is_file():
        raise ValueError(f"{what} {path} does not exist")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{what} {path} is not valid JSON ({e})") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:200]


# Hugging Face folders -------------------------------------------------------------------------------
def load_hf(path: Path, device: str | None = None):
    """A Hugging Face causal LM (with task.json) as a ``TransformerBridge``, offline, eval mode."""
    task = read_task_json(path / TASK_JSON)
    hf_config = _read_json(path / CONFIG, "Hugging Face config")
    if not isinstance(hf_config, dict) or "model_type" not in hf_config:
        raise ValueError(f"{path / CONFIG} is not a Hugging Face config (no model_type)")
    vocab = hf_config.get("vocab_size")
    if vocab != task.d_vocab:
        raise ValueError(f"{path}: model vocab_size={vocab} disagrees with task.json d_vocab={task.d_vocab}")
    n_pos = hf_config.get("n_positions", hf_config.get("max_position_embeddings"))
    if isinstance(n_pos, int) and n_pos < task.n_tokens:
        raise ValueError(f"{path}: model has {n_pos} positions, the task's contexts need (L+1)H = {task.n_tokens}")
    bridge = _boot(path, device or "cpu")
    bad = [n for n, p in bridge.original_model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise ValueError(f"{path} has NaN or Inf values in {', '.join(bad)}; expected finite weights")
    return bridge.eval()


def _boot(path: Path, device: str):
    import transformers
    from transformer_lens import TransformerBridge

    previous = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")  # a local folder: never download
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    try:
        return TransformerBridge.boot_transformers(str(path), device=device)
    except Exception as e:  # missing/corrupt weights, unsupported architecture, ...
        raise ValueError(f"{path} could not be loaded as a Hugging Face model ({_first_line(e)})") from None
    finally:
        transformers.logging.set_verbosity(verbosity)
        transformers.logging.enable_progress_bar()
        for k, v in previous.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
