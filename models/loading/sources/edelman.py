"""Edelman et al.'s ``Relative_Transformer`` (``models.nets.edelman``) as their code leaves it: the model's
``state_dict()`` in a ``.pt`` (keys ``wte.weight``, ``layers.{i}.Q.weight``, ..., ``layers.{i}.wpe.weight``,
``ln_f.*``, ``lm_head.weight``; the buffers ``layers.{i}.bias`` and ``layers.{i}.pos`` are rebuilt, and
checked), its config as mingpt writes it (``CfgNode.to_dict()``: ``n_layer``, ``n_head``, ``n_embd``,
``vocab_size``, ``block_size``, ``attention_only``; ``--config``, else ``<stem>.json`` or ``config.json``
beside the file), and task.json beside it."""

from __future__ import annotations

import torch

from models.loading.sources import files
from models.loading.sources.files import Found, Source
from models.loading.sources.task_json import read_task
from models.nets.edelman import EdelmanConfig, EdelmanTransformer, their_key
from models.plumbing.io import UsageError

NAME = "Edelman et al. Relative_Transformer"
FIELDS = ("n_layer", "n_head", "n_embd", "vocab_size", "block_size")


def detect(found: Found) -> bool:
    return files.torch_state_dict_with(found, "wte.weight", "layers.0.wpe.weight")


def read(found: Found, device: str | None = None, *, weights: bool = True) -> Source:
    raw, where = found.task_json_beside(NAME)
    task, layout = read_task(raw, where)
    if not weights:
        return Source(None, task, layout, found.where, "", NAME)
    cfg_raw = found.model_config()
    missing = [f for f in FIELDS if not isinstance(cfg_raw, dict) or not isinstance(cfg_raw.get(f), int)]
    if missing:
        raise UsageError(f"{found.where}: its config (CfgNode.to_dict() JSON) lacks integer {', '.join(missing)}")
    cfg = EdelmanConfig(
        **{f: cfg_raw[f] for f in FIELDS},
        attention_only=bool(cfg_raw.get("attention_only", True)),
        device=device or "cpu",
    )
    files.check_fits(layout, cfg.vocab_size, cfg.block_size, found.where)
    model = EdelmanTransformer(cfg)
    state = files.strip_prefixes(found.state_dict())
    for i in range(cfg.n_layer):  # their buffers: the causal mask and the relative-position index
        mask, pos = state.pop(f"layers.{i}.bias", None), state.pop(f"layers.{i}.pos", None)
        if mask is not None and not torch.equal(
            mask.reshape(mask.shape[-2:]).bool(), torch.ones(mask.shape[-2:]).tril().bool()
        ):
            raise UsageError(f"{found.where}: layers.{i}.bias is not their causal mask")
        if pos is not None and not torch.equal(pos.cpu(), model.blocks[i].attn.pos.cpu()):
            raise UsageError(f"{found.where}: layers.{i}.pos is not their relative-position index")
    files.load_their_names(model, state, their_key, found.where)
    return Source(model.to(cfg.device).eval(), task, layout, found.where, found.digest(), NAME)
