"""Edelman et al.'s ``Relative_Transformer`` (``models.nets.edelman``) as their code leaves it: the model's
``state_dict()`` in a ``.pt`` (keys ``wte.weight``, ``layers.{i}.Q.weight``, ..., ``layers.{i}.wpe.weight``,
``ln_f.*``, ``lm_head.weight``; the buffers ``layers.{i}.bias`` and ``layers.{i}.pos`` are rebuilt, and
checked), its config as mingpt writes it (``CfgNode.to_dict()``: ``n_layer``, ``n_head``, ``n_embd``,
``vocab_size``, ``block_size``, ``attention_only``; ``--config``, else ``<stem>.json`` or ``config.json``
beside the file), and task.json beside it."""

from __future__ import annotations

from pathlib import Path

import torch

from models.loading.sources import files
from models.loading.sources.files import Found, Source
from models.loading.sources.task_json import read_task
from models.nets.build import build
from models.nets.edelman import EdelmanConfig, EdelmanTransformer, their_key
from models.plumbing import io
from models.plumbing.io import UsageError

NAME = "Edelman et al. Relative_Transformer"
FIELDS = ("n_layer", "n_head", "n_embd", "vocab_size", "block_size")
TENSORS_PER_LAYER = 12  # two LayerNorms, Q, K, V, c_proj, wpe, pos; an MLP's two layers


def detect(found: Found) -> bool:
    return files.torch_state_dict_with(found, "wte.weight", "layers.0.wpe.weight")


def read(found: Found, device: str | None = None, *, weights: bool = True) -> Source:
    raw, where = found.task_json_beside(NAME)
    task, layout = read_task(raw, where)
    if not weights:
        return Source(None, task, layout, found.where, "", NAME)
    cfg = config_of(found, device)
    files.check_fits(layout, cfg.vocab_size, cfg.block_size, found.where)
    model = build(EdelmanTransformer, cfg, f"{found.where}: the model its config describes")
    state = files.strip_prefixes(found.state_dict())
    bs = cfg.block_size
    for i in range(cfg.n_layer):  # their buffers: the causal mask and the relative-position index
        mask, pos = state.pop(f"layers.{i}.bias", None), state.pop(f"layers.{i}.pos", None)
        for key, value, shapes in (
            (f"layers.{i}.bias", mask, [(1, 1, bs, bs), (bs, bs)]),
            (f"layers.{i}.pos", pos, [(bs, bs)]),
        ):
            if value is not None and tuple(value.shape) not in shapes:  # before any is read: sized by the config
                raise UsageError(
                    f"{found.where}: {key} has shape {list(value.shape)}; expected {list(shapes[0])} (block_size={bs})"
                )
        if mask is not None and not torch.equal(mask.reshape(bs, bs).bool(), torch.ones(bs, bs).tril().bool()):
            raise UsageError(f"{found.where}: layers.{i}.bias is not their causal mask")
        if pos is not None and not torch.equal(pos.cpu(), model.blocks[i].attn.pos.cpu()):
            raise UsageError(f"{found.where}: layers.{i}.pos is not their relative-position index")
    files.load_their_names(model, state, their_key, found.where)
    return Source(model.to(cfg.device).eval(), task, layout, found.where, found.digest(), NAME)


def config_of(found: Found, device: str | None) -> EdelmanConfig:
    """Their config (``CfgNode.to_dict()`` JSON), checked field by field (one line naming the config file and
    the field) and the model it describes sized before it is built: ``block_size`` b gives each layer a
    b x b position index, so a b of 100 000 would take 80 GB per layer."""
    cfg_raw = found.model_config()
    cfg_file = found.config if isinstance(found.config, (str, Path)) else found.config_file or "--config"
    missing = [f for f in FIELDS if not isinstance(cfg_raw, dict) or not isinstance(cfg_raw.get(f), int)]
    if missing:
        raise UsageError(
            f"{found.where}: its config {str(cfg_file)!r} (CfgNode.to_dict() JSON) lacks integer {', '.join(missing)}"
        )
    try:
        cfg = EdelmanConfig(
            **{f: cfg_raw[f] for f in FIELDS},
            attention_only=bool(cfg_raw.get("attention_only", True)),
            device=device or "cpu",
        )
    except ValueError as e:
        raise UsageError(f"{found.where}: its config {str(cfg_file)!r}: {e}") from None
    io.check_tensors(TENSORS_PER_LAYER * cfg.n_layer, f"{found.where}: its config's n_layer={cfg.n_layer}")
    return cfg
