"""nanoGPT: ``ckpt.pt`` as karpathy/nanoGPT's ``train.py`` writes it (``model``, ``model_args``,
``iter_num``, ``best_val_loss``, ``config``, ``optimizer``), task.json beside it (or ``--config`` naming
one). Loads as ``models.nets.hooked_transformer.HookedTransformer`` (``models.loading.converters``: exact GELU,
LayerNorm eps 1e-5)."""

from __future__ import annotations

from models.loading import converters
from models.loading.sources.files import Found, Source, check_fits, is_torch_file, strip_prefixes
from models.loading.sources.key_map import apply_key_map
from models.loading.sources.task_json import read_task
from models.plumbing.io import UsageError

NAME = "nanoGPT"


def detect(found: Found) -> bool:
    """A torch file holding ``model`` (a state dict) beside ``model_args``, or a GPT's ``transformer.wte``
    without them (then ``read`` says what is missing, rather than another format listing its own keys)."""
    obj = found.archive if is_torch_file(found.path) else None
    if not isinstance(obj, dict) or not isinstance(obj.get("model"), dict):
        return False
    return "model_args" in obj or any(str(k).endswith("transformer.wte.weight") for k in obj["model"])


def read(found: Found, device: str | None = None, *, weights: bool = True) -> Source:
    if not isinstance(found.archive.get("model_args"), dict):
        raise UsageError(
            f"{found.where} is a nanoGPT checkpoint without model_args; expected the dict nanoGPT's train.py saves "
            "beside model (n_layer, n_head, n_embd, block_size, bias, vocab_size)"
        )
    if found.config is not None:
        raw, where = found.json_arg(found.config, "task.json"), str(found.config)
    else:
        raw, where = found.task_json_beside(NAME)
    task, layout = read_task(raw, where)
    if not weights:
        return Source(None, task, layout, found.where, "", NAME)
    obj = found.archive
    cfg = converters.nanogpt_config(obj["model_args"], found.where, device)
    check_fits(layout, cfg.d_vocab, cfg.n_ctx, found.where)
    expected = converters.gpt_expected_shapes(cfg, obj["model_args"]["bias"], head=True)  # lm_head: saved or not
    state = apply_key_map(strip_prefixes(found.state_dict(obj["model"])), found.key_map_spec(), expected)
    model = converters.from_nanogpt(obj["model_args"], state, found.where, device)
    return Source(model, task, layout, found.where, found.digest(), NAME)
