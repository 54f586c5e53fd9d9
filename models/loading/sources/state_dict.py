"""Our ``CausalTransformer`` parameterisation (or one a key map turns into it) as a weight file:
``*.pt``/``*.pth``/``*.bin`` (a dict wrapping it under ``state_dict``/``model`` is unwrapped) or
``*.safetensors``. Config: ``--config``, else ``<file stem>.json``, ``config.json`` or ``task.json``
beside the file, either a checkpoint ``config.json`` of ours (sections ``model`` and ``task``) or a bare
task.json (then K = ``n_copy_heads`` if given, else L, and float64 if every tensor in the file is).
``_orig_mod.`` and ``module.`` prefixes are stripped; ``--key-map`` renames and reshapes
(``models.loading.sources.key_map``)."""

from __future__ import annotations

import torch

from models.loading.checkpoint import check_state_dict
from models.loading.sources.files import Found, Source, shapes, strip_prefixes
from models.loading.sources.key_map import apply_key_map
from models.loading.sources.task_json import read_task
from models.nets.build import build
from models.nets.causal_transformer import CausalTransformer, CausalTransformerConfig
from models.plumbing.io import UsageError

NAME = "CausalTransformer"
PLAIN = "example-major"


def detect(found: Found) -> bool:
    """Any other weight file (the formats before it in ``FORMATS`` had their say)."""
    return found.path.is_file()


def read_config(found: Found) -> tuple[dict, object, object]:
    """(model config dict, task, layout) of the file; checks that the model and the task agree."""
    raw = found.model_config()
    where = str(found.config if found.config is not None else found.config_file)
    if isinstance(raw, dict) and "model_type" in raw:
        raise UsageError(
            f"{found.path} is the weight file of a Hugging Face model (its config is a {raw['model_type']!r} "
            f"config.json): pass the folder that holds it and a task.json, --checkpoint {found.path.parent}"
        )
    if not isinstance(raw, dict):
        raise UsageError(f"config {where} must be a JSON object with 'model' and 'task', or a task.json")
    if "model" in raw:
        if not isinstance(raw.get("task"), dict):
            raise UsageError(f"config {where} has a 'model' section but no 'task'; expected both")
        model_cfg, (task, layout) = dict(raw["model"]), read_task(raw["task"], where)
    else:
        task, layout = read_task(raw, where)
        model_cfg = {"d_vocab": task.d_vocab, "n_examples": task.n_examples, "seq_len": task.seq_len}
        model_cfg["n_copy_heads"] = raw.get("n_copy_heads")
    for field, value in (("d_vocab", task.d_vocab), ("n_examples", task.n_examples), ("seq_len", task.seq_len)):
        if model_cfg.get(field) != value:
            raise UsageError(f"config {where}: model {field}={model_cfg.get(field)} disagrees with the task's {value}")
    if not layout.is_plain:
        raise UsageError(
            f"{where}: layout {layout.to_json()} applies to language models; a CausalTransformer state dict "
            f"reads the task's tokens directly (drop the layout or set it to {PLAIN!r})"
        )
    return model_cfg, task, layout


def read(found: Found, device: str | None = None, *, weights: bool = True) -> Source:
    cfg_dict, task, layout = read_config(found)
    if not weights:
        return Source(None, task, layout, found.where, "", NAME)
    obj = found.state_dict()
    if device is not None:
        cfg_dict["device"] = device
    if "dtype" not in cfg_dict:  # a bare task.json: keep the file's precision
        floats = [v.dtype for v in obj.values() if v.is_floating_point()]
        cfg_dict["dtype"] = "float64" if floats and all(f == torch.float64 for f in floats) else "float32"
    model = build(CausalTransformer, CausalTransformerConfig.from_dict(cfg_dict), f"the model of {found.where!r}")
    state = apply_key_map(strip_prefixes(obj), found.key_map_spec(), shapes(model))
    if "embed.W_E" in state and "embed.W_E" not in shapes(model):
        raise UsageError(
            f"{found.path} is a TransformerLens state dict but its config is not: pass --config with the "
            f"model's cfg.to_dict() as JSON (or put it at {found.path.with_suffix('.json').name} beside the file)"
        )
    check_state_dict(state, model, found.where)
    model.load_state_dict({k: v.to(model.cfg.torch_dtype) for k, v in state.items()})
    return Source(model.eval(), task, layout, found.where, found.digest(), NAME)
