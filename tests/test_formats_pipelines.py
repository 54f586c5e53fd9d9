"""Checkpoints from the pipelines researchers use (models.formats, models.converters): each test writes a
small model IN THAT PIPELINE'S OWN FORMAT AND LAYOUT (nanoGPT's ckpt.pt, a TransformerLens state dict and
its cfg.to_dict(), a paper-literal re-implementation with a key map, a Hugging Face GPT-2 folder) and
compares the target log-probabilities that every analysis reads (``Subject.log_probs``) with a forward
pass written here from that pipeline's own equations, in plain torch on its own tensors."""

from __future__ import annotations

import json
import math

import pytest
import safetensors.torch
import torch
import torch.nn.functional as F
from conftest import build_task
from test_layout import assemble
from torch import nn

from analyses import inspect
import models
from models.hooked_transformer import HookedTransformer
from models.subject import load_subject

SPECIAL = {"bos": 0, "sep": 1, "token_offset": 2}  # BOS, separator, task tokens after two specials
LAYOUTS = {
    "plain": {},
    "bos": {"bos": 0, "token_offset": 1},
    "sep": {"sep": 0, "token_offset": 1},
    "special": SPECIAL,
}


def small_task():
    return build_task(d_vocab=4, n_examples=3, seq_len=5, alpha=0.3)


def write_task(folder, task, layout: dict) -> None:
    raw = task.to_dict()
    raw["layout"] = {"order": "example-major", **layout}
    (folder / "task.json").write_text(json.dumps(raw))


def expected_log_probs(logits_of, tokens, task, layout: dict, dtype=torch.float64) -> torch.Tensor:
    """Assemble each context id by id in the pipeline's layout, run its forward pass, and read the
    logits at the position just before each target token, over the task's token ids."""
    L, H, d = task.n_examples, task.seq_len, task.d_vocab
    offset = layout.get("token_offset", 0)
    rows = [assemble(t.tolist(), L, H, layout.get("bos"), layout.get("sep"), offset) for t in tokens]
    ids = torch.tensor([r[0] for r in rows])
    logits = logits_of(ids).to(dtype)
    where = rows[0][1]
    picked = logits[:, [where[L, h] - 1 for h in range(H)], offset : offset + d]
    return picked.log_softmax(-1).double()


def randomize(tensors: dict, scale: float = 0.5, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {k: scale * torch.randn(v.shape, generator=g, dtype=v.dtype) for k, v in tensors.items()}


# nanoGPT ------------------------------------------------------------------------------------------------
def nanogpt_state(args: dict, seed: int = 0) -> dict:
    """Random weights under karpathy/nanoGPT's GPT names and nn.Linear [out, in] shapes."""
    C, V = args["n_embd"], args["vocab_size"]
    shapes = {"transformer.wte.weight": (V, C), "transformer.wpe.weight": (args["block_size"], C)}
    for i in range(args["n_layer"]):
        p = f"transformer.h.{i}."
        for name, shape in (
            ("ln_1", (C,)),
            ("attn.c_attn", (3 * C, C)),
            ("attn.c_proj", (C, C)),
            ("ln_2", (C,)),
            ("mlp.c_fc", (4 * C, C)),
            ("mlp.c_proj", (C, 4 * C)),
        ):
            shapes[p + name + ".weight"] = shape
            if args["bias"]:
                shapes[p + name + ".bias"] = shape[:1]
    shapes["transformer.ln_f.weight"] = (C,)
    if args["bias"]:
        shapes["transformer.ln_f.bias"] = (C,)
    state = randomize({k: torch.empty(s) for k, s in shapes.items()}, seed=seed)
    for k in state:
        if k.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            state[k] = 1 + state[k]
    state["lm_head.weight"] = state["transformer.wte.weight"]  # tied, as GPT.__init__ ties them
    return state


def nanogpt_logits(state: dict, args: dict, idx: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """model.py's GPT.forward on every position (eval mode: no dropout)."""
    s = {k: v.to(dtype) for k, v in state.items()}
    C, nh = args["n_embd"], args["n_head"]
    hs = C // nh

    def linear(x, name):
        return F.linear(x, s[name + ".weight"], s.get(name + ".bias"))

    def ln(x, name):
        return F.layer_norm(x, (C,), s[name + ".weight"], s.get(name + ".bias"), 1e-5)

    B, T = idx.shape
    x = s["transformer.wte.weight"][idx] + s["transformer.wpe.weight"][:T]
    for i in range(args["n_layer"]):
        p = f"transformer.h.{i}."
        q, k, v = linear(ln(x, p + "ln_1"), p + "attn.c_attn").split(C, dim=2)
        q, k, v = (t.view(B, T, nh, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).tril().logical_not(), float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + linear(y, p + "attn.c_proj")
        x = x + linear(F.gelu(linear(ln(x, p + "ln_2"), p + "mlp.c_fc")), p + "mlp.c_proj")  # nn.GELU(): exact
    return F.linear(ln(x, "transformer.ln_f"), s["lm_head.weight"])


def write_nanogpt(
    folder, task, layout: dict, bias: bool = True, mask_buffer: bool = False, compiled: bool = False, block_size=None
):
    """ckpt.pt as nanoGPT's train.py writes it, with task.json beside it; returns (path, state, args)."""
    from probes.layout import Layout

    lay = Layout(task.n_examples, task.seq_len, task.d_vocab, **layout)
    block_size = block_size or lay.n_positions + 3
    args = dict(n_layer=2, n_head=2, n_embd=8, block_size=block_size, bias=bias, vocab_size=lay.min_vocab + 2)
    args["dropout"] = 0.0
    state = nanogpt_state(args)
    saved = dict(state)
    if mask_buffer:  # without flash attention, CausalSelfAttention registers its mask as "bias"
        for i in range(args["n_layer"]):
            saved[f"transformer.h.{i}.attn.bias"] = (
                torch.ones(args["block_size"], args["block_size"])
                .tril()
                .view(1, 1, args["block_size"], args["block_size"])
            )
    if compiled:
        saved = {f"_orig_mod.{k}": v for k, v in saved.items()}
    params = [nn.Parameter(v.clone()) for v in state.values()]
    opt = torch.optim.AdamW(params, lr=1e-3)
    sum(p.square().sum() for p in params).backward()
    opt.step()
    ckpt = {
        "model": saved,
        "optimizer": opt.state_dict(),
        "model_args": args,
        "iter_num": 250,
        "best_val_loss": torch.tensor(1.2345),
        "config": {
            "out_dir": "out-tree",
            "batch_size": 64,
            "learning_rate": 1e-3,
            "compile": compiled,
            "dataset": "tree",
        },
    }
    folder.mkdir(exist_ok=True)
    torch.save(ckpt, folder / "ckpt.pt")
    write_task(folder, task, layout)
    return folder / "ckpt.pt", state, args


@pytest.mark.parametrize(
    "bias,mask_buffer,compiled,layout",
    [(True, False, False, "special"), (False, True, False, "bos"), (True, True, True, "plain")],
)
def test_nanogpt_ckpt_matches_nanogpts_forward_pass(tmp_path, bias, mask_buffer, compiled, layout):
    task = small_task()
    path, state, args = write_nanogpt(tmp_path / "run", task, LAYOUTS[layout], bias, mask_buffer, compiled)
    tokens, _ = task.sample(6, torch.Generator().manual_seed(1))
    subject = load_subject(path)
    assert isinstance(subject.model, HookedTransformer) and subject.n_heads == [2, 2]
    got = subject.log_probs(tokens)
    want = expected_log_probs(lambda ids: nanogpt_logits(state, args, ids), tokens, task, LAYOUTS[layout])
    assert (got - want).abs().max() < 1e-5
    got64 = load_subject(path, dtype="float64").log_probs(tokens)
    want64 = expected_log_probs(
        lambda ids: nanogpt_logits(state, args, ids, torch.float64), tokens, task, LAYOUTS[layout]
    )
    assert (got64 - want64).abs().max() < 1e-6
    # Exact GELU matters: the tanh approximation gives measurably different log-probs on these weights.
    assert (got - want).abs().max() < (want - _with_tanh_gelu(state, args, tokens, task, LAYOUTS[layout])).abs().max()


def _with_tanh_gelu(state, args, tokens, task, layout):
    exact = F.gelu
    try:
        F.gelu = lambda x: exact(x, approximate="tanh")
        return expected_log_probs(lambda ids: nanogpt_logits(state, args, ids), tokens, task, layout)
    finally:
        F.gelu = exact


def test_nanogpt_errors_are_one_line(tmp_path):
    task = small_task()
    path, state, args = write_nanogpt(tmp_path / "run", task, SPECIAL)
    ckpt = torch.load(path, weights_only=True)

    def fails(change, message, task_layout=SPECIAL):
        bad = json.loads(json.dumps({k: v for k, v in ckpt.items() if k in ("model_args", "iter_num", "config")}))
        bad = {**ckpt, **bad, **change(bad)}
        torch.save(bad, path)
        write_task(path.parent, task, task_layout)
        with pytest.raises(ValueError, match=message) as err:
            load_subject(path)
        assert "\n" not in str(err.value)

    C = args["n_embd"]
    missing = {k: v for k, v in ckpt["model"].items() if k != "transformer.h.1.mlp.c_fc.weight"}
    fails(lambda b: {"model": missing}, rf"missing transformer\.h\.1\.mlp\.c_fc\.weight \({4 * C}, {C}\)")
    fails(
        lambda b: {"model_args": {**b["model_args"], "rope_theta": 1e4}}, r"unknown nanoGPT model_args \['rope_theta'\]"
    )
    fails(lambda b: {}, "vocab_size=8 disagrees .* at least 10", {"bos": 0, "sep": 1, "token_offset": 6})
    wte = ckpt["model"]["transformer.wte.weight"]
    fails(lambda b: {"model": {**ckpt["model"], "lm_head.weight": wte + 1}}, "nanoGPT ties them")
    # A context longer than block_size: BOS + 4 sequences of 5 + 3 separators = 24 positions.
    path, _, _ = write_nanogpt(tmp_path / "short", task, SPECIAL, block_size=20)
    with pytest.raises(ValueError, match=r"the model has 20 positions; the layout .* needs 24 \(\(L\+1\)H = 20 task"):
        load_subject(path)


# TransformerLens --------------------------------------------------------------------------------------
def tl_cfg_dict(**kw) -> dict:
    """What ``HookedTransformerConfig(...).to_dict()`` of TransformerLens 2.x holds after __post_init__
    (dtype as json.dump(default=str) writes it)."""
    cfg = dict(
        n_layers=2, d_model=8, n_ctx=70, d_head=4, model_name="custom", n_heads=2, d_mlp=None, act_fn=None,
        d_vocab=8, eps=1e-5, use_attn_result=False, use_attn_scale=True, attn_scale=2.0, use_split_qkv_input=False,
        use_hook_mlp_in=False, use_attn_in=False, use_local_attn=False, ungroup_grouped_query_attention=False,
        original_architecture=None, from_checkpoint=False, checkpoint_index=None, checkpoint_label_type=None,
        checkpoint_value=None, tokenizer_name=None, window_size=None, attn_types=None, init_mode="gpt2",
        normalization_type="LN", device="cpu", n_devices=1, attention_dir="causal", attn_only=False, seed=None,
        initializer_range=0.28, init_weights=True, scale_attn_by_inverse_layer_idx=False,
        positional_embedding_type="standard", final_rms=False, d_vocab_out=8, parallel_attn_mlp=False,
        rotary_dim=None, n_params=512, use_hook_tokens=False, gated_mlp=False, default_prepend_bos=True,
        dtype="torch.float32", tokenizer_prepends_bos=None, n_key_value_heads=None, post_embedding_ln=False,
        rotary_base=10000, trust_remote_code=False, rotary_adjacent_pairs=False, load_in_4bit=False,
        num_experts=None, experts_per_token=None, relative_attention_max_distance=None,
        relative_attention_num_buckets=None, decoder_start_token_id=None, tie_word_embeddings=False,
        use_normalization_before_and_after=False, attn_scores_soft_cap=-1.0, output_logits_soft_cap=-1.0,
        use_NTK_by_parts_rope=False, NTK_by_parts_low_freq_factor=1.0, NTK_by_parts_high_freq_factor=4.0,
        NTK_by_parts_factor=8.0, use_qk_norm=False,
    )  # fmt: skip
    cfg.update(kw)
    if not cfg["attn_only"] and cfg["d_mlp"] is None:
        cfg["d_mlp"] = 4 * cfg["d_model"]
    return cfg


def tl_state(cfg: dict, with_ln: bool, seed: int = 0, scale: float = 0.5) -> dict:
    """Random weights under TransformerLens names and shapes, with its mask buffers."""
    n, D, e, V = cfg["n_heads"], cfg["d_model"], cfg["d_head"], cfg["d_vocab"]
    shapes = {"embed.W_E": (V, D), "pos_embed.W_pos": (cfg["n_ctx"], D), "unembed.W_U": (D, V), "unembed.b_U": (V,)}
    for i in range(cfg["n_layers"]):
        p = f"blocks.{i}."
        for w in "QKV":
            shapes[p + f"attn.W_{w}"], shapes[p + f"attn.b_{w}"] = (n, D, e), (n, e)
        shapes[p + "attn.W_O"], shapes[p + "attn.b_O"] = (n, e, D), (D,)
        lns = ["ln1"] if cfg["attn_only"] else ["ln1", "ln2"]
        if not cfg["attn_only"]:
            M = cfg["d_mlp"]
            shapes.update(
                {p + "mlp.W_in": (D, M), p + "mlp.b_in": (M,), p + "mlp.W_out": (M, D), p + "mlp.b_out": (D,)}
            )
        if with_ln:
            for ln in lns:
                shapes[p + f"{ln}.w"], shapes[p + f"{ln}.b"] = (D,), (D,)
    if with_ln:
        shapes["ln_final.w"], shapes["ln_final.b"] = (D,), (D,)
    state = randomize({k: torch.empty(s) for k, s in shapes.items()}, scale, seed)
    for i in range(cfg["n_layers"]):
        state[f"blocks.{i}.attn.mask"] = torch.ones(cfg["n_ctx"], cfg["n_ctx"], dtype=torch.bool).tril()
        state[f"blocks.{i}.attn.IGNORE"] = torch.tensor(-torch.inf)
    return state


def tl_logits(state: dict, cfg: dict, ids: torch.Tensor, norm: str | None, dtype=torch.float64) -> torch.Tensor:
    """TransformerLens's HookedTransformer.forward (components/*.py) on a standard-position model."""
    s = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    D = cfg["d_model"]

    def normalize(x, name):
        if norm is None:
            return x
        w, b = (s[f"{name}.w"], s[f"{name}.b"]) if norm == "LN" else (None, None)
        return F.layer_norm(x, (D,), w, b, cfg["eps"])

    act = {"gelu": F.gelu, "gelu_new": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu}.get(cfg["act_fn"])
    T = ids.shape[1]
    x = s["embed.W_E"][ids] + s["pos_embed.W_pos"][:T]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg["n_layers"]):
        p = f"blocks.{i}.attn."
        h = normalize(x, f"blocks.{i}.ln1")
        q, k, v = (torch.einsum("bpd,nde->bpne", h, s[p + f"W_{w}"]) + s[p + f"b_{w}"] for w in "QKV")
        scores = torch.einsum("bqne,bkne->bnqk", q, k) / math.sqrt(cfg["d_head"])
        pattern = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        z = torch.einsum("bnqk,bkne->bqne", pattern, v)
        x = x + torch.einsum("bqne,ned->bqd", z, s[p + "W_O"]) + s[p + "b_O"]
        if not cfg["attn_only"]:
            m = f"blocks.{i}.mlp."
            pre = normalize(x, f"blocks.{i}.ln2") @ s[m + "W_in"] + s[m + "b_in"]
            x = x + act(pre) @ s[m + "W_out"] + s[m + "b_out"]
    return normalize(x, "ln_final") @ s["unembed.W_U"] + s["unembed.b_U"]


TL_CASES = {
    "attn-only LN": (dict(attn_only=True, n_layers=3), True, "LN", "plain"),
    "gelu_new LNPre float64": (
        dict(act_fn="gelu_new", normalization_type="LNPre", dtype="torch.float64"),
        False,
        "LNPre",
        "bos",
    ),
    "relu no norm": (dict(act_fn="relu", normalization_type=None), False, None, "sep"),
    "gelu LN folded": (dict(act_fn="gelu"), False, "LNPre", "special"),  # LN config, ln weights folded away
    "gelu LN": (dict(act_fn="gelu"), True, "LN", "special"),
}


@pytest.mark.parametrize("case", TL_CASES)
def test_transformer_lens_state_dict_matches_its_forward_pass(tmp_path, case):
    kw, with_ln, norm, layout = TL_CASES[case]
    task = small_task()
    cfg = tl_cfg_dict(**kw)
    # Without normalisation the residual grows layer by layer: smaller weights keep the logits O(10), where
    # float32 rounding stays below 1e-5.
    state = tl_state(cfg, with_ln, scale=0.5 if norm else 0.25)
    torch.save(state, tmp_path / "model.pt")
    (tmp_path / "model.json").write_text(json.dumps(cfg))  # json.dump(model.cfg.to_dict(), default=str)
    write_task(tmp_path, task, LAYOUTS[layout])
    subject = load_subject(tmp_path / "model.pt")
    model = subject.model
    assert isinstance(model, HookedTransformer) and model.cfg.normalization_type == norm
    tokens, _ = task.sample(6, torch.Generator().manual_seed(2))
    float64 = cfg["dtype"] == "torch.float64"
    want = expected_log_probs(lambda ids: tl_logits(state, cfg, ids, norm), tokens, task, LAYOUTS[layout])
    assert (subject.log_probs(tokens) - want).abs().max() < (1e-6 if float64 else 1e-5)
    # The TransformerLens hooks are where TransformerLens puts them, with its shapes.
    ids = subject.layout.encode(tokens)
    _, cache = model.run_with_cache(ids)
    T, n = ids.shape[1], cfg["n_heads"]
    assert cache["blocks.0.attn.hook_pattern"].shape == (6, n, T, T)
    assert cache["blocks.1.attn.hook_z"].shape == (6, T, n, cfg["d_head"])
    assert cache["blocks.0.hook_resid_pre"].shape == (6, T, cfg["d_model"])
    assert torch.allclose(
        cache["blocks.0.attn.hook_pattern"].sum(-1),
        torch.ones(6, n, T, dtype=cache["blocks.0.attn.hook_pattern"].dtype),
    )


def test_transformer_lens_safetensors_with_explicit_config(tmp_path):
    task = small_task()
    cfg = tl_cfg_dict(act_fn="gelu_new", use_attn_result=True)
    state = tl_state(cfg, True)
    safetensors.torch.save_file(
        {k: v for k, v in state.items() if not k.endswith("IGNORE")}, tmp_path / "w.safetensors"
    )
    (tmp_path / "tl_cfg.json").write_text(json.dumps(cfg))
    write_task(tmp_path, task, {})
    subject = load_subject(tmp_path / "w.safetensors", config=tmp_path / "tl_cfg.json")
    tokens, _ = task.sample(4, torch.Generator().manual_seed(3))
    want = expected_log_probs(lambda ids: tl_logits(state, cfg, ids, "LN"), tokens, task, {})
    assert (subject.log_probs(tokens) - want).abs().max() < 1e-5
    _, cache = subject.model.run_with_cache(tokens)
    result = cache["blocks.0.attn.hook_result"]  # opt-in per-head outputs sum to the attention output
    assert torch.allclose(result.sum(2) + subject.model.blocks[0].attn.b_O, cache["blocks.0.hook_attn_out"], atol=1e-5)


@pytest.mark.parametrize(
    "change,message",
    [
        ({"flux_capacitor": 1}, r"unknown TransformerLens config fields \['flux_capacitor'\]"),
        ({"normalization_type": "RMS"}, "normalization_type='RMS' is not covered; covered: LN, LNPre, None"),
        ({"positional_embedding_type": "rotary"}, "positional_embedding_type='rotary' is not covered"),
        ({"act_fn": "silu"}, "act_fn='silu' is not covered; covered: gelu, gelu_new, relu"),
        ({"gated_mlp": True}, "gated_mlp=True is not covered"),
        ({"n_key_value_heads": 1}, "n_key_value_heads=1 .* not covered"),
        ({"attn_scores_soft_cap": 50.0}, "attn_scores_soft_cap=50.0 is not covered"),
        ({"parallel_attn_mlp": True}, "parallel_attn_mlp=True is not covered"),
        ({"dtype": "torch.bfloat16"}, "dtype='torch.bfloat16' is not covered"),
        ({"n_ctx": 20}, "the model has 20 positions; .* needs 24"),
    ],
)
def test_transformer_lens_config_errors_name_the_field(tmp_path, change, message):
    task = small_task()
    cfg = tl_cfg_dict(act_fn="gelu")
    torch.save(tl_state(cfg, True), tmp_path / "model.pt")
    (tmp_path / "model.json").write_text(json.dumps({**cfg, **change}))
    write_task(tmp_path, task, SPECIAL)
    with pytest.raises(ValueError, match=message) as err:
        load_subject(tmp_path / "model.pt")
    assert "\n" not in str(err.value)


def test_transformer_lens_state_dict_errors(tmp_path):
    task = small_task()
    cfg = tl_cfg_dict(act_fn="gelu")
    state = tl_state(cfg, True)
    write_task(tmp_path, task, {})
    torch.save({k: v for k, v in state.items() if k != "blocks.1.attn.W_O"}, tmp_path / "model.pt")
    (tmp_path / "model.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"missing blocks\.1\.attn\.W_O \(2, 4, 8\)"):
        load_subject(tmp_path / "model.pt")
    torch.save(state, tmp_path / "model.pt")
    (tmp_path / "model.json").unlink()
    with pytest.raises(ValueError, match="TransformerLens state dict but its config is not"):
        load_subject(tmp_path / "model.pt")


# Paper-literal re-implementation + key map --------------------------------------------------------------
class PaperLiteral(nn.Module):
    """PAPER.md section 3 taken literally, as a user would write it: per head ``w^H`` (2H-1 offsets) and
    ``w^L`` (L entries), the copyers' softmax over the demonstrations only; ``W_KQ`` (Kd x Kd) between
    the copies at key h' and query h; values ``softmax(x_h' W_OV)`` from the target token (d x d); no
    root bias (a uniform prior for x_0). Initialised as PAPER.md section 5: w^H +1 at offset 0, -1
    elsewhere; head k prefers demonstration ``prefer[k]`` by +3."""

    def __init__(self, d: int, L: int, H: int, prefer: list[int] | None = None, dtype=torch.float32):
        super().__init__()
        self.d, self.L, self.H = d, L, H
        w_H = -torch.ones(L, 2 * H - 1, dtype=dtype)
        w_H[:, H - 1] = 1
        self.w_H = nn.Parameter(w_H)
        w_L = torch.zeros(L, L, dtype=dtype)
        w_L[torch.arange(L), torch.tensor(prefer if prefer is not None else range(L))] = 3
        self.w_L = nn.Parameter(w_L)
        self.W_KQ = nn.Parameter(torch.zeros(L * d, L * d, dtype=dtype))
        self.W_OV = nn.Parameter(torch.zeros(d, d, dtype=dtype))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        d, L, H = self.d, self.L, self.H
        b = tokens.shape[0]
        x = F.one_hot(tokens, d).to(self.w_H.dtype).view(b, L + 1, H, d)
        h = torch.arange(H)
        score = self.w_H[:, h.view(1, H) - h.view(H, 1) + H - 1].unsqueeze(2) + self.w_L.view(L, 1, L, 1)
        copy = score.reshape(L, H, L * H).softmax(-1).view(L, H, L, H)  # [head, h, demo, h']
        v = torch.einsum("khlj,bljd->bhkd", copy, x[:, :L]).reshape(b, H, L * d)
        s = torch.einsum("bjD,DE,bhE->bhj", v, self.W_KQ, v)
        attn = s.masked_fill(torch.ones(H, H, dtype=torch.bool).triu(), float("-inf"))[:, 1:].softmax(-1)
        pred = torch.einsum("bhj,bjd->bhd", attn, (x[:, L] @ self.W_OV).softmax(-1))
        root = torch.full((b, 1, d), -math.log(d), dtype=pred.dtype)
        return torch.cat([root, pred.log()], 1)


def paper_key_map(d: int) -> dict:
    """The README's worked example."""
    return {
        "w_H": "blocks.0.attn.w_H",
        "w_L": {"to": "blocks.0.attn.w_L", "pad": {"dim": 1, "after": 1, "value": -1e4}},
        "W_KQ": {"to": "blocks.1.attn.W_KQ", "place": {"at": [d, d]}},
        "W_OV": {"to": "blocks.1.attn.W_OV", "place": {"at": [0, 0]}},
        "default": {"b_root": 0.0},
    }


def write_paper_literal(folder, task, module: PaperLiteral):
    folder.mkdir(exist_ok=True)
    torch.save(module.state_dict(), folder / "paper.pt")
    (folder / "paper_map.json").write_text(json.dumps(paper_key_map(task.d_vocab)))
    write_task(folder, task, {})
    return folder / "paper.pt", folder / "paper_map.json"


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-6)])
def test_paper_literal_reimplementation_loads_exactly_through_the_key_map(tmp_path, dtype, tol):
    task = small_task()
    module = PaperLiteral(task.d_vocab, task.n_examples, task.seq_len, dtype=dtype)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p))
    path, key_map = write_paper_literal(tmp_path, task, module)
    subject = load_subject(path, key_map=key_map)  # a bare task.json: the file's precision is kept
    tokens, _ = task.sample(32, torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = module(tokens).double()
    assert subject.family == "disentangled"
    assert (subject.log_probs(tokens) - want).abs().max() < tol
    # Without the default the file lacks b_root: the error says which tensor and its shape.
    no_default = {k: v for k, v in paper_key_map(task.d_vocab).items() if k != "default"}
    with pytest.raises(ValueError, match=rf"missing b_root \({task.d_vocab},\)"):
        load_subject(path, key_map=no_default)


@pytest.mark.parametrize(
    "entry,message",
    [
        ({"to": "blocks.0.attn.w_L", "pad": {"dim": 5, "after": 1}}, "cannot pad 'w_L' of shape .* along dim 5"),
        ({"to": "blocks.0.attn.w_L", "pad": {"dim": 1, "after": -1}}, "pad must be"),
        ({"to": "blocks.0.attn.w_L", "place": {"at": [0, 3]}}, r"cannot place 'w_L' of shape \(3, 3\) at \[0, 3\]"),
        ({"to": "blocks.0.attn.w_L", "place": {"at": [0]}}, "cannot place"),
        ({"to": "blocks.0.attn.w_L", "pad": {"dim": 1, "after": 1}, "clamp": 3}, r"unknown fields \['clamp'\]"),
    ],
)
def test_key_map_operation_errors_are_one_line(tmp_path, entry, message):
    task = small_task()
    path, _ = write_paper_literal(tmp_path, task, PaperLiteral(task.d_vocab, task.n_examples, task.seq_len))
    key_map = {**paper_key_map(task.d_vocab), "w_L": entry}
    with pytest.raises(ValueError, match=message) as err:
        load_subject(path, key_map=key_map)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="not a tensor of the model"):
        load_subject(path, key_map={**paper_key_map(task.d_vocab), "default": {"b_roots": 0.0}})


def test_a_layout_on_a_causal_transformer_state_dict_is_refused(tmp_path):
    task = small_task()
    path, key_map = write_paper_literal(tmp_path, task, PaperLiteral(task.d_vocab, task.n_examples, task.seq_len))
    write_task(tmp_path, task, SPECIAL)
    with pytest.raises(ValueError, match="applies to language models"):
        models.load_layout(path)


# Hugging Face GPT-2 in its own layout ---------------------------------------------------------------------
def write_gpt2(folder, task, layout: dict):
    from transformers import GPT2Config, GPT2LMHeadModel

    from probes.layout import Layout

    lay = Layout(task.n_examples, task.seq_len, task.d_vocab, **layout)
    hf_cfg = GPT2Config(
        vocab_size=lay.min_vocab + 1, n_positions=lay.n_positions, n_embd=8, n_layer=2, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=layout.get("bos", 0), eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(hf_cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.4)
    hf.save_pretrained(folder)
    write_task(folder, task, layout)
    return {k: v.detach().clone() for k, v in hf.state_dict().items()}, hf_cfg


def gpt2_logits(sd: dict, cfg, ids: torch.Tensor) -> torch.Tensor:
    """Hugging Face GPT-2 (modeling_gpt2.py): Conv1D weights [in, out], gelu_new, LN eps 1e-5, tied head."""
    s = {k.removeprefix("transformer."): v.double() for k, v in sd.items() if v.is_floating_point()}
    C, nh = cfg.n_embd, cfg.n_head
    hs = C // nh

    def ln(x, name):
        return F.layer_norm(x, (C,), s[name + ".weight"], s[name + ".bias"], cfg.layer_norm_epsilon)

    B, T = ids.shape
    x = s["wte.weight"][ids] + s["wpe.weight"][:T]
    for i in range(cfg.n_layer):
        p = f"h.{i}."
        q, k, v = (ln(x, p + "ln_1") @ s[p + "attn.c_attn.weight"] + s[p + "attn.c_attn.bias"]).split(C, 2)
        q, k, v = (t.view(B, T, nh, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2) / math.sqrt(hs)).masked_fill(
            ~torch.ones(T, T, dtype=torch.bool).tril(), -torch.inf
        )
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ s[p + "attn.c_proj.weight"] + s[p + "attn.c_proj.bias"]
        m = F.gelu(ln(x, p + "ln_2") @ s[p + "mlp.c_fc.weight"] + s[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + m @ s[p + "mlp.c_proj.weight"] + s[p + "mlp.c_proj.bias"]
    return ln(x, "ln_f") @ s["wte.weight"].T


def test_hugging_face_gpt2_in_its_own_layout_matches_its_forward_pass(tmp_path):
    task = small_task()
    sd, cfg = write_gpt2(tmp_path / "hf", task, SPECIAL)
    subject = load_subject(tmp_path / "hf")
    assert subject.layout.to_json() == {"order": "example-major", **SPECIAL}
    tokens, _ = task.sample(5, torch.Generator().manual_seed(5))
    want = expected_log_probs(lambda ids: gpt2_logits(sd, cfg, ids), tokens, task, SPECIAL)
    assert (subject.log_probs(tokens) - want).abs().max() < 1e-5


def test_hugging_face_folder_whose_context_is_too_short_is_refused(tmp_path):
    task = small_task()
    write_gpt2(tmp_path / "hf", task, {})
    write_task(tmp_path / "hf", task, LAYOUTS["sep"])  # 3 separators: 3 more positions than the model has
    with pytest.raises(ValueError, match="the model has 20 positions; .* needs 23"):
        load_subject(tmp_path / "hf")


# analyses.inspect on every format --------------------------------------------------------------------------
def files_outside(root, out) -> dict:
    return {p: p.stat().st_mtime_ns for p in root.rglob("*") if out not in p.parents and p != out}


def run_inspect(tmp_path, args: list[str], n_contexts: int = 64) -> dict:
    out = tmp_path / "out"
    before = files_outside(tmp_path, out)
    inspect.main([*args, "--n-contexts", str(n_contexts), "--out", str(out)])
    assert files_outside(tmp_path, out) == before  # nothing written (or touched) outside --out
    saved = json.loads((out / "inspect.json").read_text())
    assert (out / "inspect_heads.png").is_file() and saved["checkpoint_hash"]
    return saved["results"]


def test_inspect_runs_on_every_format(tmp_path):
    task = small_task()
    path, _, _ = write_nanogpt(tmp_path / "nanogpt", task, SPECIAL)
    r = run_inspect(tmp_path / "nanogpt", ["--checkpoint", str(path)])
    assert r["kind"] == "standard" and len(r["heads"]) == 4
    cfg = tl_cfg_dict(act_fn="gelu_new")
    (tmp_path / "tl").mkdir()
    torch.save(tl_state(cfg, True), tmp_path / "tl" / "model.pt")
    (tmp_path / "tl" / "model.json").write_text(json.dumps(cfg))
    write_task(tmp_path / "tl", task, LAYOUTS["sep"])
    r = run_inspect(tmp_path / "tl", ["--checkpoint", str(tmp_path / "tl" / "model.pt")])
    assert r["kind"] == "standard" and len(r["heads"]) == 4
    write_gpt2(tmp_path / "hf" / "model", task, SPECIAL)
    r = run_inspect(tmp_path / "hf", ["--checkpoint", str(tmp_path / "hf" / "model")])
    assert r["kind"] == "standard" and len(r["heads"]) == 4
    # Untrained language models: on the plateau, nothing credited.
    assert r["on_plateau"] and r["parent_selecting"] == []


def test_inspect_credits_a_paper_literal_reimplementation_trained_to_bma(tmp_path):
    """Train the paper-literal module (its own code, its own loss) briefly, save it with its key map, and
    inspect it: the parent-selecting head and each copyer's demonstration are found, as on our model."""
    torch.set_num_threads(1)
    task = build_task(d_vocab=4, n_examples=4, seq_len=6, alpha=0.3)
    prefer = [2, 0, 3, 1]  # head k starts out preferring demonstration prefer[k]
    module = PaperLiteral(task.d_vocab, 4, 6, prefer)
    opt = torch.optim.Adam(module.parameters(), lr=3e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        tokens, _ = task.sample(128, g)
        loss = -module(tokens)[:, 1:].gather(-1, tokens[:, -5:, None]).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    path, key_map = write_paper_literal(tmp_path / "run", task, module)
    r = run_inspect(tmp_path / "run", ["--checkpoint", str(path), "--key-map", str(key_map)], n_contexts=256)
    assert r["kind"] == "disentangled" and r["progress"] > 0.9 and not r["on_plateau"]
    assert r["parent_selecting"] == ["L1H0"]
    assert r["copyers"] == {f"L0H{k}": prefer[k] for k in range(4)}


def test_transformer_lens_patching_runs_on_a_loaded_model(tmp_path):
    """TransformerLens's own patching helpers on a loaded TransformerLens state dict: patching the output of
    a head whose W_O is zero changes nothing (the metric stays the corrupted one, exactly); patching a head
    that writes to the residual moves it."""
    from transformer_lens import patching

    task = small_task()
    cfg = tl_cfg_dict(act_fn="gelu")
    state = tl_state(cfg, True)
    state["blocks.1.attn.W_O"][1] = 0
    torch.save(state, tmp_path / "model.pt")
    (tmp_path / "model.json").write_text(json.dumps(cfg))
    write_task(tmp_path, task, {})
    model = load_subject(tmp_path / "model.pt").model
    clean, _ = task.sample(3, torch.Generator().manual_seed(6))
    corrupted, _ = task.sample(3, torch.Generator().manual_seed(7))
    _, cache = model.run_with_cache(clean)

    def metric(logits):
        return logits[:, -1].log_softmax(-1)[:, 0].mean()

    with torch.no_grad():
        corrupted_value = metric(model(corrupted)).item()
    got = patching.get_act_patch_attn_head_out_all_pos(model, corrupted, cache, metric)
    assert got.shape == (2, 2)
    assert got[1, 1].item() == corrupted_value
    assert abs(got[1, 0].item() - corrupted_value) > 1e-4


class Payload:
    """Stands for anything a pickle could smuggle in beside the tensors."""


def test_a_ckpt_with_more_than_tensors_and_plain_values_is_not_unpickled(tmp_path):
    task = small_task()
    path, _, _ = write_nanogpt(tmp_path / "run", task, SPECIAL)
    ckpt = torch.load(path, weights_only=True)
    torch.save({**ckpt, "config": {"callback": Payload()}}, path)
    with pytest.raises(ValueError, match="refusing to unpickle it") as err:
        load_subject(path)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "ids,message",
    [
        (torch.zeros(2, 25, dtype=torch.long), "input has 25 positions; the model has n_ctx=24"),
        (torch.full((2, 3), 8), r"input ids must lie in 0\.\.7, got 8\.\.8"),
        (torch.zeros(2, 3), "integer tensor"),
        (torch.zeros(3, dtype=torch.long), "integer tensor"),
    ],
)
def test_hooked_transformer_refuses_bad_input_in_one_line(tmp_path, ids, message):
    task = small_task()
    path, _, _ = write_nanogpt(tmp_path / "run", task, SPECIAL, block_size=24)
    model = load_subject(path).model
    with pytest.raises(ValueError, match=message):
        model(ids)
