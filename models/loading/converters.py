"""State dicts of other pipelines -> ``models.nets.hooked_transformer.HookedTransformer``.

- TransformerLens 2.0 to 3.9 ``HookedTransformer.state_dict()`` with its config (``cfg.to_dict()``, saved
  as JSON): the names are already ours; the causal-mask buffers are dropped; a config saying ``"LN"``
  whose state dict has no ``ln*.w/b`` at all (saved after ``fold_ln``) loads as ``"LNPre"``, which is
  what TransformerLens itself does when it folds. Every field of every release's ``HookedTransformerConfig``
  (``tests/models/loading/data/tl_config_fields.json``) is known here: those that do not change the forward pass
  (``IGNORED_FIELDS``) are ignored; the others must have a covered value (``REQUIRED_VALUES``, the
  defaults) or are passed on (``MODEL_FIELDS``); a field no release has is an error.
- Hugging Face GPT-2 with ``scale_attn_weights: false`` (``hf_gpt2_config``): the TransformerBridge always
  divides the scores by sqrt(head_dim), so such a folder loads here instead, with GPT-2's own equations
  (``Conv1D`` weights ``[in, out]``).
- nanoGPT (karpathy/nanoGPT ``train.py``'s ``ckpt.pt``): ``model_args`` gives the architecture (pre-norm,
  LayerNorm eps 1e-5 with an optional bias, exact GELU MLP of width 4 n_embd, learned positions, ``lm_head``
  tied to ``wte``); ``nn.Linear`` weights are ``[out, in]``: ``c_attn`` splits into q, k, v along out, and
  head n owns out-rows ``n*hs .. (n+1)*hs - 1``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from models.loading.checkpoint import check_state_dict
from models.nets.dtypes import RUN_DTYPES, dtype_name
from models.nets.hooked_transformer import HookedTransformer, HookedTransformerConfig
from models.plumbing.io import UsageError

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
        # 3.7+: used only with rotary positions (refused) or Qwen-1's log-n scaling (refused unless off)
        "train_seq_length", "use_dynamic_ntk_rope", "yarn_truncate", "yarn_global_attn_only",
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
    "use_attention_sinks": (False,),  # 3.7+
    "use_logn_attn": (False,),  # 3.7.3+
    "clip_qkv": (None,),  # 3.7.2+
    "quantization_method": (None,),  # 3.7.2+
}
SOFT_CAPS = ("attn_scores_soft_cap", "output_logits_soft_cap")  # <= 0 means off
# Fields passed on to HookedTransformerConfig (after the checks below).
MODEL_FIELDS = (
    "n_layers", "d_model", "n_ctx", "d_head", "n_heads", "d_vocab", "d_mlp", "act_fn", "normalization_type",
    "attn_only", "positional_embedding_type", "eps", "d_vocab_out", "use_attn_scale", "attn_scale", "use_attn_result",
    "scale_attn_by_inverse_layer_idx",
)  # fmt: skip
CHECKED_FIELDS = ("dtype", "n_key_value_heads", "attn_types")  # checked one by one in tl_config
KNOWN_FIELDS = IGNORED_FIELDS | set(REQUIRED_VALUES) | set(SOFT_CAPS) | set(MODEL_FIELDS) | set(CHECKED_FIELDS)
TL_BUFFERS = (".attn.mask", ".attn.IGNORE")  # TransformerLens's causal mask, re-made here

NANOGPT_ARGS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size", "dropout")
NANOGPT_EPS = 1e-5  # nanoGPT's LayerNorm: F.layer_norm(..., 1e-5)


def tl_config(raw: dict, where: str, device: str | None = None) -> HookedTransformerConfig:
    """A ``HookedTransformerConfig`` from TransformerLens's ``cfg.to_dict()``; one-line errors naming the field."""
    if not isinstance(raw, dict):
        raise UsageError(f"{where}: a TransformerLens config must be a JSON object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - KNOWN_FIELDS)
    if unknown:
        raise UsageError(
            f"{where}: unknown TransformerLens config fields {unknown}: no HookedTransformerConfig of "
            f"TransformerLens 2.0 to 3.9 has them (save the config with cfg.to_dict())"
        )
    for field, allowed in REQUIRED_VALUES.items():
        if raw.get(field, allowed[0]) not in allowed:
            raise UsageError(f"{where}: {field}={raw[field]!r} is not covered; covered: {allowed[0]!r}")
    for field in SOFT_CAPS:
        if not isinstance(raw.get(field, -1.0), (int, float)) or raw.get(field, -1.0) > 0:
            raise UsageError(f"{where}: {field}={raw[field]!r} is not covered; covered: <= 0 (off)")
    if raw.get("attn_types") is not None and set(raw["attn_types"]) != {"global"}:
        raise UsageError(f"{where}: attn_types={raw['attn_types']!r} is not covered; covered: global attention only")
    cfg = {k: raw[k] for k in MODEL_FIELDS if k in raw}
    missing = [k for k in ("n_layers", "d_model", "n_ctx", "d_head", "d_vocab") if k not in cfg]
    if missing:
        raise UsageError(f"{where}: TransformerLens config lacks {missing}")
    if cfg.get("n_heads", -1) == -1:
        cfg["n_heads"] = cfg["d_model"] // cfg["d_head"] if isinstance(cfg["d_head"], int) and cfg["d_head"] else -1
    kv = raw.get("n_key_value_heads")
    if kv is not None and kv != cfg["n_heads"]:
        raise UsageError(f"{where}: n_key_value_heads={kv!r} (grouped-query attention) is not covered; covered: null")
    dtype = raw.get("dtype", "float32")
    if dtype_name(dtype) not in RUN_DTYPES or not isinstance(dtype, str):
        raise UsageError(f"{where}: dtype={dtype!r} is not covered; covered: torch.float32, torch.float64")
    cfg["dtype"] = dtype_name(dtype)
    if device is not None:
        cfg["device"] = device
    try:
        return HookedTransformerConfig(**cfg)
    except (ValueError, TypeError) as e:
        raise UsageError(f"{where}: {e}") from None


def from_transformer_lens(state: dict[str, Tensor], cfg: HookedTransformerConfig, where: str) -> HookedTransformer:
    """A TransformerLens 2.x/3.x state dict and its config (``tl_config``) -> the hooked model (eval mode)."""
    cfg = HookedTransformerConfig(**cfg.to_dict())  # a copy: LNPre below must not change the caller's
    state = {k: v for k, v in state.items() if not k.endswith(TL_BUFFERS)}
    if cfg.normalization_type == "LN" and not any(".ln" in f".{k}" for k in state):
        cfg.normalization_type = "LNPre"  # saved after fold_ln: the weights are folded into W_Q, ...
    return load_into(HookedTransformer(cfg), state, where)


def nanogpt_config(
    model_args: dict, where: str, device: str | None = None, dtype: str = "float32"
) -> HookedTransformerConfig:
    """nanoGPT's ``model_args`` (``GPTConfig`` fields) -> the equivalent ``HookedTransformerConfig``."""
    if not isinstance(model_args, dict):
        raise UsageError(f"{where}: model_args must be a dict of GPTConfig fields, got {type(model_args).__name__}")
    unknown = sorted(set(model_args) - set(NANOGPT_ARGS))
    if unknown:
        raise UsageError(f"{where}: unknown nanoGPT model_args {unknown}; expected a subset of {list(NANOGPT_ARGS)}")
    missing = [k for k in NANOGPT_ARGS[:-1] if k not in model_args]
    if missing:
        raise UsageError(f"{where}: nanoGPT model_args lacks {missing}")
    a = model_args
    if (
        not isinstance(a["n_head"], int)
        or not isinstance(a["n_embd"], int)
        or a["n_head"] < 1
        or a["n_embd"] % a["n_head"]
    ):
        raise UsageError(f"{where}: n_embd={a['n_embd']!r} must be a multiple of n_head={a['n_head']!r}")
    if not isinstance(a["bias"], bool):
        raise UsageError(f"{where}: model_args bias must be true or false, got {a['bias']!r}")
    try:
        return HookedTransformerConfig(
            n_layers=a["n_layer"], d_model=a["n_embd"], n_ctx=a["block_size"], d_head=a["n_embd"] // a["n_head"],
            n_heads=a["n_head"], d_vocab=a["vocab_size"], d_mlp=4 * a["n_embd"], act_fn="gelu",
            normalization_type="LN", eps=NANOGPT_EPS, device=device or "cpu", dtype=dtype,
        )  # fmt: skip
    except ValueError as e:
        raise UsageError(f"{where}: {e}") from None


def gpt_expected_shapes(cfg: HookedTransformerConfig, bias: bool, head: bool = False) -> dict[str, tuple[int, ...]]:
    """The parameter names and shapes of nanoGPT's ``GPT`` (``nn.Linear`` ``[out, in]``; ``lm_head`` tied to
    ``wte`` unless ``head``), which Hugging Face GPT-2 shares up to its ``Conv1D`` ``[in, out]``."""
    C, M = cfg.d_model, cfg.d_mlp
    shapes = {"transformer.wte.weight": (cfg.d_vocab, C), "transformer.wpe.weight": (cfg.n_ctx, C)}
    linear = {"attn.c_attn": (3 * C, C), "attn.c_proj": (C, C), "mlp.c_fc": (M, C), "mlp.c_proj": (C, M)}
    for i in range(cfg.n_layers):
        for name in ("ln_1", "ln_2"):
            shapes[f"transformer.h.{i}.{name}.weight"] = (C,)
            if bias:
                shapes[f"transformer.h.{i}.{name}.bias"] = (C,)
        for name, shape in linear.items():
            shapes[f"transformer.h.{i}.{name}.weight"] = shape
            if bias:
                shapes[f"transformer.h.{i}.{name}.bias"] = (shape[0],)
    shapes["transformer.ln_f.weight"] = (C,)
    if bias:
        shapes["transformer.ln_f.bias"] = (C,)
    if head:
        shapes["lm_head.weight"] = (cfg.d_vocab, C)
    return shapes


def file_dtype(state: dict[str, Tensor]) -> str:
    """A file's own precision: ``"float64"`` if every floating tensor of ``state`` is, else ``"float32"``."""
    floats = [v.dtype for v in state.values() if v.is_floating_point()]
    return "float64" if floats and all(f == torch.float64 for f in floats) else "float32"


def from_nanogpt(
    model_args: dict, state: dict[str, Tensor], where: str, device: str | None = None
) -> HookedTransformer:
    """nanoGPT's ``model_args`` and ``model`` state dict -> the hooked model (eval mode), in the file's precision."""
    cfg = nanogpt_config(model_args, where, device, file_dtype(state))
    # attn.bias is nanoGPT's causal-mask buffer (present when flash attention is unavailable);
    # lm_head.weight is the same tensor as wte (tied) and may be saved or not.
    state = {k: v for k, v in state.items() if not k.endswith(".attn.bias")}
    head = state.pop("lm_head.weight", None)
    check_state_dict(state, _Expected(gpt_expected_shapes(cfg, model_args["bias"])), where)
    if head is not None and not torch.equal(head, state["transformer.wte.weight"]):
        raise UsageError(f"{where}: lm_head.weight differs from transformer.wte.weight; nanoGPT ties them")
    return _from_gpt_names(cfg, state, where)


def _from_gpt_names(cfg: HookedTransformerConfig, state: dict[str, Tensor], where: str) -> HookedTransformer:
    """A checked state dict under nanoGPT's names and ``[out, in]`` shapes -> the hooked model."""
    wte = state["transformer.wte.weight"]
    C, n, hs = cfg.d_model, cfg.n_heads, cfg.d_head

    def get(key: str, shape) -> Tensor:  # a bias-free model's biases are zeros
        return state[key] if key in state else torch.zeros(shape, dtype=wte.dtype)

    out = {
        "embed.W_E": wte,
        "pos_embed.W_pos": state["transformer.wpe.weight"],
        "ln_final.w": state["transformer.ln_f.weight"],
        "ln_final.b": get("transformer.ln_f.bias", C),
        "unembed.W_U": state.get("lm_head.weight", wte).T,
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
        out[q + "mlp.b_in"] = get(p + "mlp.c_fc.bias", cfg.d_mlp)
        out[q + "mlp.W_out"] = state[p + "mlp.c_proj.weight"].T
        out[q + "mlp.b_out"] = get(p + "mlp.c_proj.bias", C)
    return load_into(HookedTransformer(cfg), out, where)


# Hugging Face GPT-2 activation_function -> ours (gelu_pytorch_tanh is the same tanh formula as gelu_new).
HF_GPT2_ACTS = {"gelu_new": "gelu_new", "gelu_pytorch_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
HF_GPT2_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def needs_hooked_gpt2(hf_config: dict) -> bool:
    """A GPT-2 config the TransformerBridge would compute wrongly: ``scale_attn_weights: false`` (the
    bridge divides the scores by sqrt(head_dim) regardless)."""
    return hf_config.get("model_type") == "gpt2" and hf_config.get("scale_attn_weights", True) is False


def hf_gpt2_config(hf_config: dict, where: str, device: str | None = None, dtype: str = "float32"):
    """Hugging Face ``GPT2Config`` (config.json) -> the equivalent ``HookedTransformerConfig``; one line
    naming what is not covered."""
    act = hf_config.get("activation_function", "gelu_new")
    if act not in HF_GPT2_ACTS:
        raise UsageError(
            f"{where}: scale_attn_weights=false with activation_function={act!r} is not covered "
            f"(the TransformerBridge cannot compute unscaled attention, and this path covers {', '.join(HF_GPT2_ACTS)})"
        )
    if hf_config.get("add_cross_attention"):
        raise UsageError(f"{where}: add_cross_attention=true is not covered with scale_attn_weights=false")
    C, n = hf_config.get("n_embd", 768), hf_config.get("n_head", 12)
    if not isinstance(C, int) or not isinstance(n, int) or n < 1 or C % n:
        raise UsageError(f"{where}: n_embd={C!r} must be a multiple of n_head={n!r}")
    try:
        return HookedTransformerConfig(
            n_layers=hf_config.get("n_layer", 12), d_model=C, n_ctx=hf_config.get("n_positions", 1024),
            d_head=C // n, n_heads=n, d_vocab=hf_config.get("vocab_size", 50257),
            d_mlp=hf_config.get("n_inner") or 4 * C, act_fn=HF_GPT2_ACTS[act], normalization_type="LN",
            eps=hf_config.get("layer_norm_epsilon", 1e-5), use_attn_scale=False,
            scale_attn_by_inverse_layer_idx=bool(hf_config.get("scale_attn_by_inverse_layer_idx", False)),
            device=device or "cpu", dtype=dtype,
        )  # fmt: skip
    except ValueError as e:
        raise UsageError(f"{where}: {e}") from None


def from_hf_gpt2(hf_config: dict, state: dict[str, Tensor], where: str, device: str | None = None):
    """A Hugging Face GPT-2 state dict (``save_pretrained``) -> the hooked model, GPT-2's equations:
    ``Conv1D`` weights ``[in, out]`` transposed to nanoGPT's ``[out, in]``, ``lm_head`` tied unless saved
    apart with ``tie_word_embeddings: false``. In the file's precision."""
    cfg = hf_gpt2_config(hf_config, where, device, file_dtype(state))
    state = {k if k.startswith(("transformer.", "lm_head.")) else f"transformer.{k}": v for k, v in state.items()}
    state = {k: v for k, v in state.items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    tied = hf_config.get("tie_word_embeddings", True) is not False
    if tied:
        state.pop("lm_head.weight", None)
    shapes = gpt_expected_shapes(cfg, True, head=not tied)
    conv1d = [k for k in shapes if k.endswith(HF_GPT2_CONV1D)]
    check_state_dict(state, _Expected({**shapes, **{k: shapes[k][::-1] for k in conv1d}}), where)
    return _from_gpt_names(cfg, {**state, **{k: state[k].T for k in conv1d}}, where)


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
