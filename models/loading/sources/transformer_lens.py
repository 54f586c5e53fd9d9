"""TransformerLens 2.x/3.x: ``torch.save(model.state_dict(), "w.pt")`` (or a ``.safetensors`` file) plus
``model.cfg.to_dict()`` as JSON (``--config``, ``<stem>.json`` or ``config.json``: a JSON object with
``n_layers``, ``d_model``, ``n_ctx``, ...; ``dtype`` may be the string ``"torch.float32"``), task.json
beside the file. Loads as ``models.nets.hooked_transformer.HookedTransformer`` (``models.loading.converters``)."""

from __future__ import annotations

import dataclasses

from models.loading import converters
from models.loading.sources.files import Found, Source, check_fits, shapes, strip_prefixes
from models.loading.sources.key_map import apply_key_map
from models.loading.sources.task_json import read_task
from models.nets.hooked_transformer import HookedTransformer
from models.plumbing.io import UsageError

NAME = "TransformerLens"


def detect(found: Found) -> bool:
    """A weight file whose config (``--config``, else ``<stem>.json`` or ``config.json``) is a
    TransformerLens ``cfg.to_dict()``."""
    if not found.path.is_file():
        return False
    given = found.config is not None
    file = found.config_file
    if not given and (file is None or file.name == "task.json"):
        return False
    raw = found.json_arg(found.config if given else file, "config")
    return is_tl_config(raw)


def is_tl_config(raw) -> bool:
    return isinstance(raw, dict) and {"n_layers", "d_model"} <= set(raw) and "model" not in raw and "pi" not in raw


def read(found: Found, device: str | None = None, *, weights: bool = True) -> Source:
    task, layout = read_task(*found.task_json_beside(NAME))
    if not weights:
        return Source(None, task, layout, found.where, "", NAME)
    cfg = converters.tl_config(found.model_config(), found.where, device)
    check_fits(layout, cfg.d_vocab, cfg.n_ctx, found.where)
    if cfg.d_vocab_out < layout.min_vocab:  # it could not predict every id the task's contexts hold
        raise UsageError(
            f"{found.where}: the model predicts d_vocab_out={cfg.d_vocab_out} tokens; the task's layout "
            f"{layout.to_json()} needs at least {layout.min_vocab}"
        )
    expected = shapes(HookedTransformer(dataclasses.replace(cfg, device="meta")))  # names and shapes only
    state = apply_key_map(strip_prefixes(found.state_dict()), found.key_map_spec(), expected)
    model = converters.from_transformer_lens(state, cfg, found.where)
    return Source(model, task, layout, found.where, found.digest(), NAME)
