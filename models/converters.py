"""State dicts of other pipelines -> ``models.hooked_transformer.HookedTransformer``.

- TransformerLens 2.x/3.x ``HookedTransformer.state_dict()`` with its config (``cfg.to_dict()``, saved
  as JSON): the names are already ours; the causal-mask buffers are dropped; a config saying ``"LN"``
  whose state dict has no ``ln*.w/b`` at all (saved after ``fold_ln``) loads as ``"LNPre"``, which is
  what TransformerLens itself does when it folds. Config fields that do not change the forward pass
  (``IGNORED_FIELDS``) are ignored; the others must have a covered value (``REQUIRED_VALUES``); any field
  TransformerLens 2.x/3.x does not have is an error.
- nanoGPT (karpathy/nanoGPT ``train.py``'s ``ckpt.pt``): ``model_args`` gives the architecture (pre-norm,
  LayerNorm eps 1e-5 with an optional bias, exact GELU MLP of width 4 n_embd, learned positions, ``lm_head``
  tied to ``wte``); ``nn.Linear`` weights are ``[out, in]``: ``c_attn`` splits into q, k, v along out, and
  head n owns out-rows ``n*hs .. (n+1)*hs - 1``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from models.checkpoint import check_state_dict
from models.dtypes import RUN_DTYPES, dtype_name
from models.hooked_transformer import HookedTransformer, HookedTransformerConfig

# TransformerLens 2.x/3.x HookedTransformerConfig fields that do not change the forward pass of the
# covered models (names, seeds, initialisation, tokenizer, devices, which hooks are called).
IGNORED_FIELDS = frozenset(
    {
        "model_name", "seed", "init_mode", "init_weights", "initializer_range", "n_params", "tokenizer_name",
        "tokenizer_prepends_bos", "default_prepend_bos", "from_checkpoint", "checkpoint_index",
        "checkpoint_label_type", "checkpoint_value", "original_architecture", "n_devices", "device",
        "trust_remote_code", "use_hook_tokens", "use_hook_mlp_in", "use_attn_in", "use_split_qkv_input",
        "ungroup_grouped_query_attention", "decoder_start_token_id", "tie_word_embeddings",
        "load_in_4bit", "layer_norm_folding",
        # rotary settings: used only with positional_embedding_type="rotary", which is refused
        "rotary_dim", "rotary_base", "rotary_base_local", "rotary_adjacent_pairs", "rotary_scaling_factor",
        "use_NTK_by_parts_rope", "NTK_by_parts_low_freq_factor", "NTK_by_parts_high_freq_factor",
        "NTK_by_parts_factor", "NTK_original_ctx_len", "use_yarn_rope", "yarn_factor", "yarn_attention_factor",
        "yarn_beta_fast", "yarn_beta_slow", "yarn_original_max_position_embeddings", "norm_topk_prob",
    }
)  # fmt: skip
# Fields that change the forward pass, with the values covered (the TransformerLens defaults).
REQUIRED_VALUES = {
    "use_local_attn": (False,),
    "window_size": (None,),
    "attention_dir": ("causal",),
    "scale_attn_by_inverse_layer_idx": (False,),
    "final_rms": (False,),
    "parallel_attn_mlp": (False,),
    "gated_mlp": (False,),
    "post_embedding_ln": (False,),
    "num_experts": (None,),
    "experts_per_token": (None,),
    "relative_attention_max_distance": (None,),
    "relative_attention_num_buckets": (None,),
    "use_normalization_before_and_after": (False,),
    "use_qk_norm": (False,),
    "uses_rms_norm": (False,),
}
SOFT_CAPS = ("attn_scores_soft_cap", "output_logits_soft_cap")  # <= 0 means off
# Fields passed on to HookedTransformerConfig (after the checks below).
MODEL_FIELDS = (
    "n_layers", "d_model", "n_ctx", "d_head", "n_heads", "d_vocab", "d_mlp", "act_fn", "normalization_type",
    "attn_only", "positional_embedding_type", "eps", "d_vocab_out", "use_attn_scale", "attn_scale", "use_attn_result",
)  # fmt: skip
TL_BUFFERS = (".attn.mask", ".attn.IGNORE")  # TransformerLens's causal mask, re-made here

NANOGPT_ARGS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size", "dropout")
NANOGPT_EPS = 1e-5  # nanoGPT's LayerNorm: F.layer_norm(..., 1e-5)


def tl_config(raw: dict, where: str, device: str | None = None) -> HookedTransformerConfig:
    """A ``HookedTransformerConfig`` from TransformerLens's ``cfg.to_dict()``; one-line errors naming the field."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: a TransformerLens config must be a JSON object, got {type(raw).__name__}")
    known = (
        IGNORED_FIELDS
        | set(REQUIRED_VALUES)
        | set(SOFT_CAPS)
        | set(MODEL_FIELDS)
        | {"dtype", "n_key_value_heads", "attn_types"}
    )
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"{where}: unknown TransformerLens config fields {unknown} (not in TransformerLens 2.x/3.x)")
    for field, allowed in REQUIRED_VALUES.items():
        if raw.get(field, allowed[0]) not in allowed:
            raise ValueError(f"{where}: {field}={raw[field]!r} is not covered; covered: {allowed[0]!r}")
    for field in SOFT_CAPS:
        if not isinstance(raw.get(field, -1.0), (int, float)) or raw.get(field, -1.0) > 0:
            raise ValueError(f"{where}: {field}={raw[field]!r} is not covered; covered: <= 0 (off)")
    if raw.get("attn_types") is not None and set(raw["attn_types"]) != {"global"}:
        raise ValueError(f"{where}: attn_types={raw['attn_types']!r} is not covered; covered: global attention only")
    cfg = {k: raw[k] for k in MODEL_FIELDS if k in raw}
    missing = [k for k in ("n_layers", "d_model", "n_ctx", "d_head", "d_vocab") if k not in cfg]
    if missing:
        raise ValueError(f"{where}: TransformerLens config lacks {missing}")
    if cfg.get("n_heads", -1) == -1:
        cfg["n_heads"] = cfg["d_model"] // cfg["d_head"] if isinstance(cfg["d_head"], int) and cfg["d_head"] else -1
    kv = raw.get("n_key_value_heads")
    if kv is not None and kv != cfg["n_heads"]:
        raise ValueError(f"{where}: n_key_value_heads={kv!r} (grouped-query attention) is not covered; covered: null")
    dtype = raw.get("dtype", "float32")
    if dtype_name(dtype) not in RUN_DTYPES or not isinstance(dtype, str):
        raise ValueError(f"{where}: dtype={dtype!r} is not covered; covered: torch.float32, torch.float64")
    cfg["dtype"] = dtype_name(dtype)
    if device is not None:
        cfg["device"] = device
    try:
        return HookedTransformerConfig(**cfg)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{where}: {e}") from None


def from_transformer_lens(state: dict[str, Tensor], cfg: HookedTransformerConfig, where: str) -> HookedTransformer:
    """A TransformerLens 2.x/3.x state dict and its config (``tl_config``) -> the hooked model (eval mode)."""
    cfg = HookedTransformerConfig(**cfg.to_dict())  # a copy: LNPre below must not change the caller's
    state = {k: v for k, v in state.items() if not k.endswith(TL_BUFFERS)}
    if cfg.normalization_type == "LN" and not any(".ln" in f".{k}" for k in state):
        cfg.normalization_type = "LNPre"  # saved after fold_ln: the weights are folded into W_Q, ...
    return load_into(HookedTransformer(cfg), state, where)


def nanogpt_config(model_args: dict, where: str, device: str | None = None) -> HookedTransformerConfig:
    """nanoGPT's ``model_args`` (``GPTConfig`` fields) -> the equivalent ``HookedTransformerConfig``."""
    if not isinstance(model_args, dict):
        raise ValueError(f"{where}: model_args must be a dict of GPTConfig fields, got {type(model_args).__name__}")
    unknown = sorted(set(model_args) - set(NANOGPT_ARGS))
    if unknown:
        raise ValueError(f"{where}: unknown nanoGPT model_args {unknown}; expected a subset of {list(NANOGPT_ARGS)}")
    missing = [k for k in NANOGPT_ARGS[:-1] if k not in model_args]
    if missing:
        raise ValueError(f"{where}: nanoGPT model_args lacks {missing}")
    a = model_args
    if (
        not isinstance(a["n_head"], int)
        or not isinstance(a["n_embd"], int)
        or a["n_head"] < 1
        or a["n_embd"] % a["n_head"]
    ):
        raise ValueError(f"{where}: n_embd={a['n_embd']!r} must be a multiple of n_head={a['n_head']!r}")
    if not isinstance(a["bias"], bool):
        raise ValueError(f"{where}: model_args bias must be true or false, got {a['bias']!r}")
    try:
        return HookedTransformerConfig(
            n_layers=a["n_layer"], d_model=a["n_embd"], n_ctx=a["block_size"], d_head=a["n_embd"] // a["n_head"],
            n_heads=a["n_head"], d_vocab=a["vocab_size"], d_mlp=4 * a["n_embd"], act_fn="gelu",
            normalization_type="LN", eps=NANOGPT_EPS, device=device or "cpu",
        )  # fmt: skip
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def nanogpt_expected_shapes(model_args: dict) -> dict[str, tuple[int, ...]]:
    """The parameter names and shapes of nanoGPT's ``GPT`` (``lm_head.weight`` tied to ``wte``)."""
    C, V, n = model_args["n_embd"], model_args["vocab_size"], model_args["n_layer"]
    shapes = {"transformer.wte.weight": (V, C), "transformer.wpe.weight": (model_args["block_size"], C)}
    linear = {"attn.c_attn": (3 * C, C), "attn.c_proj": (C, C), "mlp.c_fc": (4 * C, C), "mlp.c_proj": (C, 4 * C)}
    for i in range(n):
        for name in ("ln_1", "ln_2"):
            shapes[f"transformer.h.{i}.{name}.weight"] = (C,)
            if model_args["bias"]:
                shapes[f"transformer.h.{i}.{name}.bias"] = (C,)
        for name, shape in linear.items():
            shapes[f"transformer.h.{i}.{name}.weight"] = shape
            if model_args["bias"]:
                shapes[f"transformer.h.{i}.{name}.bias"] = (shape[0],)
    shapes["transformer.ln_f.weight"] = (C,)
    if model_args["bias"]:
        shapes["transformer.ln_f.bias"] = (C,)
    return shapes


def from_nanogpt(
    model_args: dict, state: dict[str, Tensor], where: str, device: str | None = None
) -> HookedTransformer:
    """nanoGPT's ``model_args`` and ``model`` state dict -> the hooked model (eval mode)."""
    cfg = nanogpt_config(model_args, where, device)
    # attn.bias is nanoGPT's causal-mask buffer (present when flash attention is unavailable);
    # lm_head.weight is the same tensor as wte (tied) and may be saved or not.
    state = {k: v for k, v in state.items() if not k.endswith(".attn.bias")}
    head = state.pop("lm_head.weight", None)
    check_state_dict(state, _Expected(nanogpt_expected_shapes(model_args)), where)
    wte = state["transformer.wte.weight"]
    if head is not None and not torch.equal(head, wte):
        raise ValueError(f"{where}: lm_head.weight differs from transformer.wte.weight; nanoGPT ties them")
    C, n, hs = cfg.d_model, cfg.n_heads, cfg.d_head

    def get(key: str, shape) -> Tensor:  # a bias-free model's biases are zeros
        return state[key] if key in state else torch.zeros(shape, dtype=wte.dtype)

    out = {
        "embed.W_E": wte,
        "pos_embed.W_pos": state["transformer.wpe.weight"],
        "ln_final.w": state["transformer.ln_f.weight"],
        "ln_final.b": get("transformer.ln_f.bias", C),
        "unembed.W_U": wte.T,
        "unembed.b_U": torch.zeros(cfg.d_vocab, dtype=wte.dtype),
    }
    for i in range(cfg.n_layers):
        p, q = f"transformer.h.{i}.", f"blocks.{i}."
        w_qkv, b_qkv = state[p + "attn.c_attn.weight"], get(p + "attn.c_attn.bias", 3 * C)
        for name, w, b in zip("QKV", w_qkv.split(C, 0), b_qkv.split(C, 0)):
            out[q + f"attn.W_{name}"] = w.view(n, hs, C).transpose(1, 2)  # x @ w.T, head n = rows n*hs..
            out[q + f"attn.b_{name}"] = b.view(n, hs)
        out[q + "attn.W_O"] = state[p + "attn.c_proj.weight"].T.reshape(n, hs, C)
        out[q + "attn.b_O"] = get(p + "attn.c_proj.bias", C)
        for ours, theirs in (("ln1", "ln_1"), ("ln2", "ln_2")):
            out[q + f"{ours}.w"] = state[p + f"{theirs}.weight"]
            out[q + f"{ours}.b"] = get(p + f"{theirs}.bias", C)
        out[q + "mlp.W_in"] = state[p + "mlp.c_fc.weight"].T
        out[q + "mlp.b_in"] = get(p + "mlp.c_fc.bias", 4 * C)
        out[q + "mlp.W_out"] = state[p + "mlp.c_proj.weight"].T
        out[q + "mlp.b_out"] = get(p + "mlp.c_proj.bias", C)
    return load_into(HookedTransformer(cfg), out, where)


def load_into(model: HookedTransformer, state: dict[str, Tensor], where: str) -> HookedTransformer:
    """Check names, shapes and finiteness (one error listing them all), load, eval mode."""
    check_state_dict(state, model, where)
    model.load_state_dict({k: v.to(model.cfg.torch_dtype).contiguous() for k, v in state.items()})
    return model.eval()


class _Expected:
    """Stands in for a module in ``check_state_dict``: names and shapes only."""

    def __init__(self, shapes: dict[str, tuple[int, ...]]):
        self.shapes = shapes

    def state_dict(self) -> dict[str, Tensor]:
        return {k: torch.empty(s, device="meta") for k, s in self.shapes.items()}
