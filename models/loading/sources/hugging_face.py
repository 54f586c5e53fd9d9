"""A Hugging Face causal-LM folder (``save_pretrained``: ``config.json`` + weights) with a ``task.json``
in it, loaded offline through ``transformer_lens.TransformerBridge`` (see ``models.standard``); a GPT-2 with
``scale_attn_weights: false``, which the bridge would scale anyway, as ``HookedTransformer``
(``models.loading.converters.from_hf_gpt2``)."""

from __future__ import annotations

import os
import re

import torch

from models.loading import converters
from models.loading.checkpoint import CONFIG, FORMAT
from models.loading.dtypes import weight_dtype_name
from models.loading.sources.files import (
    HF_WEIGHTS,
    TASK_JSON,
    Found,
    Source,
    as_state_dict,
    check_fits,
    check_not_a_weight_file_folder,
    hf_weight_files,
    no_file_options,
    read_archive,
)
from models.loading.sources.task_json import read_task
from models.plumbing import io
from models.plumbing.io import UsageError, listing, one_line

NAME = "Hugging Face"


def detect(found: Found) -> bool:
    return found.path.is_dir() and (found.path / TASK_JSON).is_file()


def read(found: Found, device: str | None = None, *, weights: bool = True) -> Source:
    path = found.path
    no_file_options(found, "a Hugging Face folder: its config.json and task.json define it")
    task, layout = read_task(found.json(path / TASK_JSON, "task.json"), str(path / TASK_JSON))
    if not weights:
        return Source(None, task, layout, found.where, "", NAME)
    check_not_a_weight_file_folder(path, "a Hugging Face folder (config.json with model_type, and its weights)")
    hf_config = found.json(path / CONFIG, "Hugging Face config")
    if isinstance(hf_config, dict) and hf_config.get("format") == FORMAT:
        raise UsageError(
            f"{str(path)!r} is one of our checkpoint folders with a stray {TASK_JSON} (its task is in {CONFIG}); "
            f"remove the {TASK_JSON}"
        )
    if not isinstance(hf_config, dict) or "model_type" not in hf_config:
        raise UsageError(f"{path / CONFIG} is not a Hugging Face config (no model_type)")
    vocab = hf_config.get("vocab_size")
    if not _is_int(vocab):
        raise UsageError(f"{path / CONFIG}: vocab_size={vocab!r}; expected an integer")
    n_pos = hf_config.get("n_positions", hf_config.get("max_position_embeddings"))
    check_fits(layout, vocab, n_pos if _is_int(n_pos) else None, str(path))
    if converters.needs_hooked_gpt2(hf_config):  # the bridge would scale the scores anyway
        converters.hf_gpt2_config(hf_config, str(path), device)  # sized before the weights are read
        check_weights(path, check_size(hf_config, str(path / CONFIG), device), found)
        model = converters.from_hf_gpt2(hf_config, _hf_weights(path), str(path), device)
        return Source(model, task, layout, found.where, found.digest(), NAME)
    check_weights(path, check_size(hf_config, str(path / CONFIG), device), found)
    bridge = _boot(path, device or "cpu")
    bad = [n for n, p in bridge.original_model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise UsageError(f"{path} has NaN or Inf values in {', '.join(bad)}; expected finite weights")
    return Source(bridge.eval(), task, layout, found.where, found.digest(), NAME)


LAYER_FIELDS = ("n_layer", "num_hidden_layers", "n_layers", "num_layers")
WIDTH_FIELDS = ("n_embd", "hidden_size", "d_model")


def check_size(hf_config: dict, where: str, device: str | None):
    """The memory of the model a Hugging Face ``config.json`` (``where``) describes, before it is built: a
    floor from its numbers first (every layer has at least a query and an output projection, width x width; the
    embedding is vocab x width), so that no absurd config is even built on the meta device; then its
    parameters and buffers counted on the meta device (``from_config``, nothing allocated). Returns that
    meta model."""
    layers, width = _field(hf_config, LAYER_FIELDS, where), _field(hf_config, WIDTH_FIELDS, where)
    vocab = hf_config["vocab_size"]
    what = f"{where} (a {hf_config['model_type']!r} model of {layers} layers, width {width}, vocab {vocab})"
    io.check_tensors(4 * layers, what)  # every layer: at least the weights and biases of two projections
    io.check_memory((2 * layers * width * width + vocab * width) * 2, what, device)  # 2 bytes: float16 or more
    import transformers

    try:
        config = transformers.CONFIG_MAPPING[hf_config["model_type"]].from_dict(hf_config)
        with torch.device("meta"):
            meta = transformers.AutoModelForCausalLM.from_config(config)
    except Exception as e:  # an architecture transformers does not know, a config it refuses
        raise UsageError(f"{where} is not a Hugging Face config transformers can build ({one_line(e)[:200]})") from None
    io.check_memory(sum(t.numel() * t.element_size() for t in [*meta.parameters(), *meta.buffers()]), what, device)
    return meta


def check_weights(path, meta, found: Found) -> None:
    """The folder's weight files against ``meta``, the model its config.json builds (``check_size``), read
    from their headers (nothing loaded): every parameter is there (tied ones once), nothing is left over (a
    layer the config does not have), every tensor has its shape and a float dtype. transformers would fill
    a missing tensor with random numbers, drop a left-over one and cast an int8 one, all silently."""
    strip = lambda k: k.removeprefix(meta.base_model_prefix + ".")  # noqa: E731 (saved with or without it)
    groups: dict[int, list[str]] = {}  # tied parameters: one tensor, several names
    for name, param in meta.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(strip(name))
    shapes = {strip(k): tuple(v.shape) for k, v in meta.state_dict().items()}
    known = set(shapes) | {strip(k) for k, _ in meta.named_buffers()}
    ignored = [re.compile(p) for p in getattr(meta, "_keys_to_ignore_on_load_unexpected", None) or []]
    tensors = {strip(k): v for k, v in _header(path, found).items()}
    tied = getattr(meta, "_tied_weights_keys", None) or () if getattr(meta.config, "tie_word_embeddings", False) else ()
    optional = {strip(k) for k in tied}  # an output embedding tied to the input one: from_pretrained ties it
    missing = [names[0] for names in groups.values() if not any(n in tensors or n in optional for n in names)]
    extra = [k for k in tensors if k not in known and not any(p.search(k) for p in ignored)]
    if missing or extra:
        parts = ([f"missing {listing(sorted(missing), 3)}"] if missing else []) + (
            [f"not in the model {listing(sorted(extra), 3)}"] if extra else []
        )
        raise UsageError(f"{path}: its weights do not cover the model its config.json describes: {' | '.join(parts)}")
    wrong = [
        f"{k} {list(tensors[k][0])} vs {list(shapes[k])}"
        for k in sorted(tensors)
        if k in shapes and tensors[k][0] != shapes[k]
    ]
    if wrong:
        raise UsageError(f"{path}: weights of other shapes than its config.json says: {listing(wrong, 3)}")
    ints = [
        f"{k} ({dtype})"
        for k, (_, dtype) in sorted(tensors.items())
        if k in shapes and weight_dtype_name(dtype) is None
    ]
    if ints:
        raise UsageError(
            f"{path}: {listing(ints, 3)} are not float tensors; expected float16/bfloat16/float32/float64 weights"
        )


def _header(path, found: Found) -> dict[str, tuple[tuple[int, ...], str]]:
    """{name: (shape, dtype)} of every tensor in the folder's weight files, from their headers (a .bin is
    memory-mapped: nothing is read but its index)."""
    from safetensors import safe_open

    tensors = {}
    for file in hf_weight_files(path, found.json):
        if file.name.endswith(".json"):
            continue
        if not file.is_file():
            raise UsageError(f"{path}: the weight file {file.name} its index names {io.what_is(file)}")
        if file.suffix == ".safetensors":
            with io.openable(file) as name:
                try:
                    with safe_open(str(name), "pt") as f:
                        for k in f.keys():
                            tensors[k] = (tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype())
                except Exception as e:
                    raise UsageError(f"{file} is not a readable safetensors file ({one_line(e)})") from None
        else:
            for k, v in as_state_dict(read_archive(file), file).items():
                tensors[k] = (tuple(v.shape), str(v.dtype).replace("torch.", ""))
    if not tensors:
        raise UsageError(f"{path} has no weights: expected {' or '.join(HF_WEIGHTS)} (or their shards and index)")
    return tensors


def _field(hf_config: dict, names: tuple[str, ...], where: str) -> int:
    """The first of the config fields ``names`` present (a non-negative integer), else 0."""
    value = next((hf_config[n] for n in names if n in hf_config), 0)
    if not _is_int(value) or value < 0:
        raise UsageError(f"{where}: {next(n for n in names if n in hf_config)}={value!r}; expected an integer >= 0")
    return value


def _hf_weights(path) -> dict:
    """The state dict of a Hugging Face folder's single weight file."""
    for name in HF_WEIGHTS:
        if (path / name).is_file():
            return as_state_dict(read_archive(path / name), path / name)
    raise UsageError(f"{path} has no model.safetensors or pytorch_model.bin (a sharded checkpoint is not covered here)")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def fused_activations(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with every Hugging Face ``NewGELUActivation`` (GPT-2's ``gelu_new``, the tanh formula spelled
    in tensor ops) replaced by ``GELUTanh`` (the same formula, torch's fused kernel; transformers' own
    ``gelu_pytorch_tanh``): equal to float rounding, and a third of the time of the MLP's activation, which was
    a quarter of a circuit discovery's on the shipped GPT-2 (cProfile). Returns ``model``, changed in place."""
    from transformers.activations import GELUTanh, NewGELUActivation

    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is NewGELUActivation:
                setattr(parent, name, GELUTanh())
    return model


def no_retained_patterns(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with each attention of TransformerLens's bridge forgetting its pattern once its forward returns.
    TransformerLens 4.3's ``JointQKVAttentionBridge`` keeps each forward's pattern on the module (``_pattern``,
    read nowhere), and with it, in a pass with gradients, that pass's whole autograd graph until the next forward
    replaces it, layer by layer: on a GPT-2-small-shaped model the node attribution's memory grew by 28 MB a part
    of 11 contexts (2.91 GB after 47 parts, 2.00 after 12). Returns ``model``, changed in place."""

    def forget(module, args, output):
        module._pattern = None

    for module in model.modules():
        if hasattr(module, "_pattern"):
            module.register_forward_hook(forget)
    return model


def _boot(path, device: str):
    import transformers
    from transformer_lens import TransformerBridge

    previous = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")  # a local folder: never download
    verbosity, bars = transformers.logging.get_verbosity(), transformers.logging.is_progress_bar_enabled()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    rng = torch.random.get_rng_state()  # building the model draws its initial weights: the caller's stream is kept
    try:
        with io.openable(path) as name:  # any name the shell allows
            return no_retained_patterns(fused_activations(TransformerBridge.boot_transformers(str(name), device=device)))
    except Exception as e:  # missing/corrupt weights, unsupported architecture, ...
        raise UsageError(f"{path} could not be loaded as a Hugging Face model ({one_line(e)[:200]})") from None
    finally:
        torch.random.set_rng_state(rng)
        transformers.logging.set_verbosity(verbosity)
        (transformers.logging.enable_progress_bar if bars else transformers.logging.disable_progress_bar)()
        for k, v in previous.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
