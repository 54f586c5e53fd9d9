"""Loading models saved by other pipelines: ``models.load(path)`` dispatches here for anything that is
not one of our checkpoint folders. Nothing is unpickled beyond tensors, dicts, lists, numbers and
strings (``torch.load(weights_only=True)``); nothing is written.

What you trained -> what is read
- Our ``CausalTransformer`` parameterisation (or one a key map turns into it), as ``*.pt``/``*.pth``/
  ``*.bin`` (a dict wrapping it under ``state_dict``/``model`` is unwrapped) or ``*.safetensors``; config:
  ``config=`` (``--config``), else ``<file stem>.json``, ``config.json`` or ``task.json`` beside the file,
  either a checkpoint ``config.json`` of ours (sections ``model`` and ``task``) or a bare task.json (then
  K = ``n_copy_heads`` if given, else L, and float64 if every tensor in the file is). ``_orig_mod.`` and
  ``module.`` prefixes are stripped.
- TransformerLens 2.x/3.x: ``torch.save(model.state_dict(), "w.pt")`` (or safetensors) plus
  ``model.cfg.to_dict()`` as JSON (``--config``, ``<stem>.json`` or ``config.json``; a JSON object with
  ``n_layers``, ``d_model``, ``n_ctx``, ...; ``dtype`` may be the string ``"torch.float32"``), task.json
  beside the file. Loads as ``models.hooked_transformer.HookedTransformer`` (``models.converters``).
- nanoGPT: ``ckpt.pt`` as karpathy/nanoGPT's ``train.py`` writes it (``model``, ``model_args``,
  ``iter_num``, ``best_val_loss``, ``config``, ``optimizer``), task.json beside it (or ``--config``
  naming one). Loads as the same ``HookedTransformer`` (exact GELU, LayerNorm eps 1e-5).
- A Hugging Face causal-LM folder (``config.json`` + weights) with a ``task.json`` in it: loaded offline
  through ``transformer_lens.TransformerBridge`` (see ``models.standard``); a GPT-2 with
  ``scale_attn_weights: false``, which the bridge would scale anyway, as ``HookedTransformer``
  (``models.converters.from_hf_gpt2``).

Language models (the last three) read a context through task.json's ``layout``
(``probes.layout.Layout``): their vocabulary must hold ``layout.min_vocab`` ids and their context
``layout.n_positions`` positions. Logits at position p predict the id at p + 1 (the ordinary shift).

Key map (``key_map=`` / ``--key-map map.json``): names in the file (after prefix stripping) -> our
names, each optionally transformed, in this order: ``transpose`` (two dims; ``true`` means the last
two), ``reshape``, ``pad`` (``dim``, ``before``/``after`` counts, constant ``value``), ``place`` (into a
zero tensor of ``shape``, default the expected shape of ``to``, with its first element at ``at``).
The reserved key ``default`` gives constants for tensors the file lacks, filled to the expected shape.
Keys the map does not name keep their name. The paper-literal parameterisation (PAPER.md section 3
taken literally: ``w^L`` with L entries, ``W_KQ`` Kd x Kd over the copies only, ``W_OV`` d x d from the
token only, no root bias), with d = 5, L = K = 10, maps exactly onto ``CausalTransformer`` by::

    {"w_H":  "blocks.0.attn.w_H",
     "w_L":  {"to": "blocks.0.attn.w_L", "pad": {"dim": 1, "after": 1, "value": -1e4}},
     "W_KQ": {"to": "blocks.1.attn.W_KQ", "place": {"at": [5, 5]}},
     "W_OV": {"to": "blocks.1.attn.W_OV", "place": {"at": [0, 0]}},
     "default": {"b_root": 0.0}}

(``w_L``'s extra entry is the target's own prefix: -1e4 gives it weight exp(-1e4) = 0 exactly, so the
copyers' softmax runs over the demonstrations only; ``W_KQ`` fills the copy-copy block of the
((K+1)d)^2 matrix, ``W_OV`` the token rows of the (K+1)d x d one; a zero root bias is a uniform prior.)

task.json schema (beside a language model; also accepted as the config of a state dict)::

    {"kind": "markov_tree",            # the only task kind supported
     "d_vocab": 5,                     # d, the task's vocabulary (task tokens 0..d-1)
     "n_examples": 6, "seq_len": 8,    # L demonstrations and H tokens per sequence
     "pi": [[...], ...],               # d x d row-stochastic kernel, pi[a][b] = pi(b | a)
     "root": [...],                    # optional distribution of x_1 (default uniform)
     "layout": {"order": "example-major", "bos": 0, "sep": 1, "token_offset": 2}}
                                       # optional; each key optional; or the legacy string "example-major..."
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import warnings
from pathlib import Path

import safetensors
import safetensors.torch
import torch
import torch.nn.functional as F
from torch import Tensor

from models import converters
from models.causal_transformer import CausalTransformer, CausalTransformerConfig
from models.checkpoint import CONFIG, FORMAT, build, check_state_dict
from models.io import read_json
from probes.layout import Layout
from probes.tasks import MarkovTreeTask

TORCH_SUFFIXES = (".pt", ".pth", ".bin")
SAFETENSORS_SUFFIX = ".safetensors"
TASK_JSON = "task.json"
PREFIXES = ("_orig_mod.", "module.")
LAYOUT = "example-major"
DEFAULTS = "default"  # reserved key-map key: constants for tensors the file lacks
ENTRY_FIELDS = ("to", "transpose", "reshape", "pad", "place")
NANOGPT, TRANSFORMER_LENS, CAUSAL = "nanoGPT", "TransformerLens", "CausalTransformer"


def is_foreign(path: str | Path) -> bool:
    """True for paths this module loads: a weight file, or a Hugging Face folder with a task.json."""
    path = Path(path)
    return path.is_file() or (path.is_dir() and (path / TASK_JSON).is_file())


def load_foreign(path: str | Path, device: str | None = None, *, key_map=None, config=None):
    """The model in ``path`` (see the module docstring), in eval mode: a ``CausalTransformer``, a
    ``HookedTransformer`` (TransformerLens, nanoGPT) or a ``TransformerBridge`` (Hugging Face)."""
    path = Path(path)
    if path.is_dir():
        if key_map is not None or config is not None:
            raise ValueError(
                f"{path} is a Hugging Face folder: its config.json and task.json define it; "
                f"--key-map and --config apply to weight files only"
            )
        return load_hf(path, device)
    spec = read_key_map(key_map)
    kind, obj = classify(path, config)
    where = str(path)
    if kind == NANOGPT:
        cfg = converters.nanogpt_config(obj["model_args"], where, device)
        check_fits(load_foreign_layout(path, config), cfg.d_vocab, cfg.n_ctx, where)
        state = apply_key_map(strip_prefixes(_as_state_dict(obj["model"], path)), spec)
        return converters.from_nanogpt(obj["model_args"], state, where, device)
    if kind == TRANSFORMER_LENS:
        cfg = converters.tl_config(_json_arg(config or _find_config(path), "config"), where, device)
        check_fits(load_foreign_layout(path, config), cfg.d_vocab, cfg.n_ctx, where)
        state = apply_key_map(strip_prefixes(obj), spec, _shapes(converters.HookedTransformer(cfg)))
        return converters.from_transformer_lens(state, cfg, where)
    cfg_dict, _ = read_file_config(path, config)
    if device is not None:
        cfg_dict["device"] = device
    if "dtype" not in cfg_dict:  # a bare task.json: keep the file's precision
        floats = [v.dtype for v in obj.values() if v.is_floating_point()]
        cfg_dict["dtype"] = "float64" if floats and all(f == torch.float64 for f in floats) else "float32"
    model = build(CausalTransformer, CausalTransformerConfig.from_dict(cfg_dict), f"the model of {str(path)!r}")
    state = apply_key_map(strip_prefixes(obj), spec, _shapes(model))
    if "embed.W_E" in state and "embed.W_E" not in _shapes(model):
        raise ValueError(
            f"{path} is a TransformerLens state dict but its config is not: pass --config with the "
            f"model's cfg.to_dict() as JSON (or put it at {path.with_suffix('.json').name} beside the file)"
        )
    check_state_dict(state, model, where)
    model.load_state_dict({k: v.to(model.cfg.torch_dtype) for k, v in state.items()})
    return model.eval()


def load_foreign_task(path: str | Path, config=None) -> MarkovTreeTask:
    """The task of a foreign model: task.json beside a language model, or the config of a state dict."""
    path = Path(path)
    raw, where = _task_source(path, config)
    return task_from_dict(raw, where)


def load_foreign_layout(path: str | Path, config=None) -> Layout:
    """Where the model at ``path`` reads the task's tokens: task.json's ``layout`` for language models;
    the task's own layout for a ``CausalTransformer`` state dict (which reads task tokens directly)."""
    path = Path(path)
    raw, where = _task_source(path, config)
    task = task_from_dict(raw, where)
    layout = read_layout(raw, task, where)
    if not path.is_dir() and file_kind(path, config) == CAUSAL and not layout.is_plain:
        raise ValueError(
            f"{where}: layout {layout.to_json()} applies to language models; a CausalTransformer state dict "
            f"reads the task's tokens directly (drop the layout or set it to {LAYOUT!r})"
        )
    return layout


def foreign_hash(path: str | Path, key_map=None, config=None) -> str:
    """sha256 (16 hex digits) of the weights, the config, the task.json and the key map of a foreign model."""
    path = Path(path)
    h = hashlib.sha256()
    files = sorted(f for f in path.iterdir() if f.is_file()) if path.is_dir() else [path]
    if not path.is_dir() and (path.parent / TASK_JSON).is_file():
        files.append(path.parent / TASK_JSON)
    for f in files:
        h.update(f.name.encode() + f.read_bytes())
    if not path.is_dir() and config is not None:
        h.update(json.dumps(_json_arg(config, "config")).encode())
    elif not path.is_dir():
        found = next((c for c in _config_candidates(path) if c.is_file()), None)
        if found is not None:
            h.update(json.dumps(_read_json(found, "config")).encode())
    if key_map is not None:
        h.update(json.dumps(_json_arg(key_map, "key map")).encode())
    return h.hexdigest()[:16]


def check_fits(layout: Layout, vocab: int, n_ctx: int | None, where: str) -> None:
    """A language model must hold every id the layout uses and every position it needs."""
    if vocab < layout.min_vocab:
        raise ValueError(
            f"{where}: model vocab_size={vocab} disagrees with the task (d_vocab={layout.d_vocab}, layout "
            f"{layout.to_json()}): it needs at least {layout.min_vocab} ids"
        )
    if n_ctx is not None and n_ctx < layout.n_positions:
        raise ValueError(
            f"{where}: the model has {n_ctx} positions; the layout {layout.to_json()} needs {layout.n_positions} "
            f"((L+1)H = {(layout.n_examples + 1) * layout.seq_len} task tokens plus BOS and separators)"
        )


# Weight files ---------------------------------------------------------------------------------------
def classify(path: Path, config=None) -> tuple[str, object]:
    """(kind, contents): a nanoGPT ``ckpt.pt`` (the whole dict), or a state dict that is TransformerLens's
    (its config says so) or ours."""
    obj = read_archive(path)
    if _is_nanogpt(obj):
        return NANOGPT, obj
    return _state_kind(path, config), _as_state_dict(obj, path)


def file_kind(path: Path, config=None) -> str:
    """``classify``'s kind alone, without reading a safetensors file's tensors."""
    if path.suffix.lower() in TORCH_SUFFIXES and _is_nanogpt(read_archive(path)):
        return NANOGPT
    return _state_kind(path, config)


def _is_nanogpt(obj) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get("model"), dict) and "model_args" in obj


def _state_kind(path: Path, config) -> str:
    raw = _json_arg(config, "config") if config is not None else None
    if raw is None:
        found = next((c for c in _config_candidates(path)[:2] if c.is_file()), None)
        raw = _read_json(found, "config") if found is not None else None
    if isinstance(raw, dict) and "model_type" in raw:
        raise ValueError(
            f"{path} is the weight file of a Hugging Face model (its config is a {raw['model_type']!r} config.json): "
            f"pass the folder that holds it and a task.json, --checkpoint {path.parent}"
        )
    if isinstance(raw, dict) and {"n_layers", "d_model"} <= set(raw) and "model" not in raw and "pi" not in raw:
        return TRANSFORMER_LENS
    return CAUSAL


def _torch_load(path: Path, **kw):
    with warnings.catch_warnings():  # torch's notice on its own storage API (quantized tensors) is not for users
        warnings.filterwarnings("ignore", message="TypedStorage is deprecated")
        return torch.load(path, map_location="cpu", weights_only=True, **kw)


def read_archive(path: Path):
    """The contents of a .pt/.pth/.bin (``weights_only=True``) or .safetensors file."""
    suffix = path.suffix.lower()
    if suffix in TORCH_SUFFIXES:
        try:
            try:  # memory-mapped: reading a file again for its kind (task, layout) costs little
                return _torch_load(path, mmap=True)
            except RuntimeError as e:
                if "mmap" not in str(e):
                    raise
                return _torch_load(path)  # legacy (non-zip) format
        except pickle.UnpicklingError as e:
            blocked = [line.strip() for line in str(e).splitlines() if "GLOBAL" in line]
            if not blocked:  # not a pickle at all
                raise ValueError(f"{path} is not a readable PyTorch file (not a state-dict archive)") from None
            raise ValueError(
                f"{path} is not a plain state dict: refusing to unpickle it, it would load code ({blocked[0][:160]})"
            ) from None
        except Exception as e:  # truncated or corrupt archives raise RuntimeError, EOFError, ...
            raise ValueError(f"{path} is not a readable PyTorch file ({_first_line(e)})") from None
    if suffix == SAFETENSORS_SUFFIX:
        try:
            return safetensors.torch.load_file(path)
        except Exception as e:
            raise ValueError(f"{path} is not a readable safetensors file ({_first_line(e)})") from None
    raise ValueError(
        f"{path}: unknown weight format {suffix!r}; expected one of "
        f"{', '.join(TORCH_SUFFIXES + (SAFETENSORS_SUFFIX,))}, or a checkpoint folder"
    )


def read_weights(path: Path) -> dict[str, Tensor]:
    """The state dict in a weight file (unwrapped from ``state_dict``/``model``)."""
    return _as_state_dict(read_archive(path), path)


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


def _shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


# Key maps -------------------------------------------------------------------------------------------
def read_key_map(key_map) -> dict[str, dict]:
    """Validate a key map (a dict or a JSON path) into ``{source: {to, transpose, reshape, pad, place}}``
    plus ``{"default": {our key: constant}}`` (see the module docstring)."""
    if key_map is None:
        return {}
    raw = _json_arg(key_map, "key map")
    if not isinstance(raw, dict):
        raise ValueError(
            f"key map must be a JSON object {{file key: our key or {{to, transpose, reshape, pad, place}}}}, "
            f"got {type(raw).__name__}"
        )
    spec: dict[str, dict] = {}
    for src, entry in raw.items():
        if src == DEFAULTS:
            spec[DEFAULTS] = _read_defaults(entry)
            continue
        entry = {"to": entry} if isinstance(entry, str) else entry
        if not isinstance(entry, dict) or not isinstance(entry.get("to"), str):
            raise ValueError(f"key map entry {src!r} must be a key name or an object with a 'to' name")
        unknown = set(entry) - set(ENTRY_FIELDS)
        if unknown:
            raise ValueError(
                f"key map entry {src!r} has unknown fields {sorted(unknown)}; expected {', '.join(ENTRY_FIELDS)}"
            )
        t = entry.get("transpose", False)
        if not (isinstance(t, bool) or (isinstance(t, list) and len(t) == 2 and all(_is_int(i) for i in t))):
            raise ValueError(f"key map entry {src!r}: transpose must be true/false or two dims, got {t!r}")
        r = entry.get("reshape")
        if r is not None and not _int_list(r):
            raise ValueError(f"key map entry {src!r}: reshape must be a list of ints, got {r!r}")
        spec[src] = {
            "to": entry["to"],
            "transpose": t,
            "reshape": r,
            "pad": _read_pad(src, entry.get("pad")),
            "place": _read_place(src, entry.get("place")),
        }
    return spec


def _read_pad(src: str, pad) -> dict | None:
    if pad is None:
        return None
    usage = 'pad must be {"dim": int, "before": int >= 0, "after": int >= 0, "value": number}'
    if not isinstance(pad, dict) or set(pad) - {"dim", "before", "after", "value"} or not _is_int(pad.get("dim")):
        raise ValueError(f"key map entry {src!r}: {usage}, got {pad!r}")
    before, after, value = pad.get("before", 0), pad.get("after", 0), pad.get("value", 0.0)
    if not (_is_int(before) and _is_int(after) and before >= 0 and after >= 0) or not _is_number(value):
        raise ValueError(f"key map entry {src!r}: {usage}, got {pad!r}")
    return {"dim": pad["dim"], "before": before, "after": after, "value": float(value)}


def _read_place(src: str, place) -> dict | None:
    if place is None:
        return None
    usage = 'place must be {"at": [ints >= 0], "shape": [ints] (optional: the expected shape)}'
    if not isinstance(place, dict) or set(place) - {"at", "shape"} or not _int_list(place.get("at")):
        raise ValueError(f"key map entry {src!r}: {usage}, got {place!r}")
    shape = place.get("shape")
    if any(i < 0 for i in place["at"]) or (shape is not None and not _int_list(shape)):
        raise ValueError(f"key map entry {src!r}: {usage}, got {place!r}")
    return {"at": list(place["at"]), "shape": None if shape is None else list(shape)}


def _read_defaults(entry) -> dict[str, float]:
    if not isinstance(entry, dict) or not all(isinstance(k, str) and _is_number(v) for k, v in entry.items()):
        raise ValueError(f'key map "default" must be {{our key: number}} for tensors the file lacks, got {entry!r}')
    return {k: float(v) for k, v in entry.items()}


def apply_key_map(
    state: dict[str, Tensor], spec: dict[str, dict], expected: dict[str, tuple[int, ...]] | None = None
) -> dict[str, Tensor]:
    """Rename and transform as ``spec`` says (every key it names must be in ``state``), then fill the
    ``default`` tensors the result lacks. ``expected``: our names -> shapes, for ``place`` and defaults."""
    expected = expected or {}
    defaults = spec.get(DEFAULTS, {})
    entries = {k: v for k, v in spec.items() if k != DEFAULTS}
    absent = sorted(set(entries) - set(state))
    if absent:
        raise ValueError(f"key map names {', '.join(absent)}, not in the file (it has {', '.join(sorted(state))})")
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        entry = entries.get(key)
        if entry is not None:
            value = _transform(key, value, entry, expected.get(entry["to"]))
            key = entry["to"]
        if key in out:
            raise ValueError(f"key map sends two tensors to {key!r}")
        out[key] = value
    for key, value in defaults.items():
        if key in out:
            continue
        if key not in expected:
            raise ValueError(
                f"key map default {key!r} is not a tensor of the model; expected one of {', '.join(expected)}"
            )
        dtype = next((v.dtype for v in out.values() if v.is_floating_point()), torch.float32)
        out[key] = torch.full(expected[key], value, dtype=dtype)
    return out


def _transform(key: str, value: Tensor, entry: dict, expected: tuple[int, ...] | None) -> Tensor:
    t, r, pad, place = entry["transpose"], entry["reshape"], entry["pad"], entry["place"]
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
    if pad is not None:
        dim = pad["dim"]
        if not -value.ndim <= dim < value.ndim:
            raise ValueError(f"key map cannot pad {key!r} of shape {tuple(value.shape)} along dim {dim}")
        widths = [0, 0] * (value.ndim - 1 - dim % value.ndim) + [pad["before"], pad["after"]]
        value = F.pad(value, widths, value=pad["value"])  # F.pad lists dims from the last
    if place is not None:
        shape = place["shape"] or (list(expected) if expected is not None else None)
        if shape is None:
            raise ValueError(
                f"key map entry {key!r}: place needs a shape (the target {entry['to']!r} is not a model tensor)"
            )
        at = place["at"]
        if (
            len(at) != value.ndim
            or len(shape) != value.ndim
            or any(a + n > s for a, n, s in zip(at, value.shape, shape))
        ):
            raise ValueError(
                f"key map cannot place {key!r} of shape {tuple(value.shape)} at {at} in a tensor of shape {list(shape)}"
            )
        block = value.new_zeros(shape)
        block[tuple(slice(a, a + n) for a, n in zip(at, value.shape))] = value
        value = block
    return value.contiguous()


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _int_list(x) -> bool:
    return isinstance(x, list) and all(_is_int(i) for i in x)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# Configs and task.json ------------------------------------------------------------------------------
def read_file_config(path: Path, config=None) -> tuple[dict, MarkovTreeTask]:
    """(model config dict, task) for a ``CausalTransformer`` weight file; checks that the two agree."""
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


def _config_candidates(path: Path) -> list[Path]:
    return [path.with_suffix(".json"), path.parent / CONFIG, path.parent / TASK_JSON]


def _find_config(path: Path) -> Path:
    tried = _config_candidates(path)
    for candidate in tried:
        if candidate.is_file():
            return candidate
    raise ValueError(
        f"{path} needs a config: pass --config (a checkpoint config.json, a TransformerLens cfg.to_dict() "
        f"JSON or a task.json); none found at {', '.join(str(t) for t in tried)}"
    )


def _task_source(path: Path, config) -> tuple[dict, str]:
    """(raw task dict, where) of the model at ``path``: the task.json of a folder or beside a language
    model (``config`` may name it for nanoGPT), else the task section of the state dict's config."""
    if path.is_dir():
        return _read_json(path / TASK_JSON, "task.json"), str(path / TASK_JSON)
    kind = file_kind(path, config)
    if kind == CAUSAL:
        where = config if config is not None else _find_config(path)
        raw = _json_arg(where, "config")
        task = raw.get("task") if isinstance(raw, dict) and "model" in raw else raw
        return task, str(where)
    if kind == NANOGPT and config is not None:
        return _json_arg(config, "task.json"), str(config)
    beside = path.parent / TASK_JSON
    if not beside.is_file():
        raise ValueError(f"{path} is a {kind} model; its task (and layout) must be in {beside}, which does not exist")
    return _read_json(beside, "task.json"), str(beside)


def read_task_json(path: str | Path) -> MarkovTreeTask:
    """Parse and validate a task.json (schema in the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path} does not exist; a Hugging Face folder needs a task.json beside its weights")
    return task_from_dict(_read_json(path, "task.json"), str(path))


def task_from_dict(raw, where: str) -> MarkovTreeTask:
    """A ``MarkovTreeTask`` from the task.json schema, with errors that name the file and the field
    (the ``layout`` is validated too; ``read_layout`` returns it)."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: task must be a JSON object, got {type(raw).__name__}")
    if raw.get("kind", "markov_tree") != "markov_tree":
        raise ValueError(f"{where}: task kind {raw.get('kind')!r} is not supported; expected 'markov_tree'")
    for field in ("n_examples", "seq_len", "d_vocab"):
        value = raw.get(field)
        if field in raw and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{where}: {field} must be a positive integer, got {value!r}")
    try:
        task = MarkovTreeTask.from_dict(raw)
    except (TypeError, RuntimeError) as e:  # e.g. a ragged pi list
        raise ValueError(f"{where}: malformed task ({_first_line(e)})") from None
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    read_layout(raw, task, where)
    return task


def read_layout(raw: dict, task: MarkovTreeTask, where: str) -> Layout:
    """task.json's ``layout`` for ``task`` (absent: the task's own layout)."""
    try:
        return Layout.from_json(raw.get("layout"), task.n_examples, task.seq_len, task.d_vocab)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _json_arg(value, what: str, beside: Path | None = None):
    """A dict given directly, or the parsed JSON file it names."""
    if isinstance(value, dict):
        return value
    return _read_json(Path(value), what)


def _read_json(path: Path, what: str):
    return read_json(path, what)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:200]


# Hugging Face folders -------------------------------------------------------------------------------
def load_hf(path: Path, device: str | None = None):
    """A Hugging Face causal LM (with task.json) as a ``TransformerBridge``, offline, eval mode."""
    layout = load_foreign_layout(path)
    hf_config = _read_json(path / CONFIG, "Hugging Face config")
    if isinstance(hf_config, dict) and hf_config.get("format") == FORMAT:
        raise ValueError(f"{str(path)!r} is one of our checkpoint folders with a stray {TASK_JSON} (its task is in {CONFIG}); remove the {TASK_JSON}")
    if not isinstance(hf_config, dict) or "model_type" not in hf_config:
        raise ValueError(f"{path / CONFIG} is not a Hugging Face config (no model_type)")
    vocab = hf_config.get("vocab_size")
    if not _is_int(vocab):
        raise ValueError(f"{path / CONFIG}: vocab_size={vocab!r}; expected an integer")
    n_pos = hf_config.get("n_positions", hf_config.get("max_position_embeddings"))
    check_fits(layout, vocab, n_pos if _is_int(n_pos) else None, str(path))
    if converters.needs_hooked_gpt2(hf_config):  # the bridge would scale the scores anyway
        return converters.from_hf_gpt2(hf_config, _hf_weights(path), str(path), device)
    bridge = _boot(path, device or "cpu")
    bad = [n for n, p in bridge.original_model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise ValueError(f"{path} has NaN or Inf values in {', '.join(bad)}; expected finite weights")
    return bridge.eval()


def _hf_weights(path: Path) -> dict[str, Tensor]:
    """The state dict of a Hugging Face folder's single weight file."""
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (path / name).is_file():
            return read_weights(path / name)
    raise ValueError(f"{path} has no model.safetensors or pytorch_model.bin (a sharded checkpoint is not covered here)")


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
