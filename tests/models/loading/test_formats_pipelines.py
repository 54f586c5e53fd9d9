"""Checkpoints from the pipelines researchers use (models.loading.sources, models.loading.converters): each test writes a
small model IN THAT PIPELINE'S OWN FORMAT AND LAYOUT (nanoGPT's ckpt.pt, a TransformerLens state dict and
its cfg.to_dict(), a paper-literal re-implementation with a key map, a Hugging Face GPT-2 folder) and
compares the target log-probabilities that every analysis reads (``Subject.log_probs``) with a forward
pass written here from that pipeline's own equations, in plain torch on its own tensors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import safetensors.torch
import torch
import torch.nn.functional as F
from conftest import build_task
from test_layout import assemble
from torch import nn

import models
from analyses import inspect
from models.interp.subject import load_subject
from models.loading import converters
from models.loading.loading import load as models_load
from models.nets.hooked_transformer import HookedTransformer

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


def nanogpt_logits(state: dict, args: dict, idx: torch.Tensor, dtype=torch.float32, heads=None) -> torch.Tensor:
    """model.py's GPT.forward on every position (eval mode: no dropout). ``heads(layer, att, y) -> y``, if given,
    sees each layer's attention ``[B, head, query, key]`` and may replace its per-head outputs ``y``
    ``[B, head, T, head size]`` before ``c_proj`` (an ablation)."""
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
        y = att @ v
        y = (y if heads is None else heads(i, att, y)).transpose(1, 2).contiguous().view(B, T, C)
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


NANOGPT_SOURCE = Path(__file__).parent / "data" / "nanogpt" / "model.py"  # karpathy/nanoGPT 3adf61e, MIT


def nanogpt_module():
    """karpathy/nanoGPT's own model.py (vendored unmodified as test data)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("nanogpt_model", NANOGPT_SOURCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")
@pytest.mark.parametrize(
    "bias,compiled,flash,dtype",
    [
        (True, False, True, torch.float32),
        (False, True, True, torch.float32),
        (True, True, False, torch.float32),  # no flash attention: the causal mask is saved as attn.bias
        (True, False, True, torch.float64),
        (False, False, False, torch.float64),
    ],
)
def test_a_ckpt_written_by_nanogpts_own_code_loads_with_its_numbers(
    tmp_path, monkeypatch, bias, compiled, flash, dtype
):
    """GPT and GPTConfig from nanoGPT's model.py, trained three steps with its own configure_optimizers,
    every parameter perturbed, saved as train.py saves it (raw_model.state_dict() of the compiled model
    when compile=True); the log-probs match GPT.forward: float32 rounding, 1e-12 in float64."""
    from probes.layout import Layout

    torch.set_num_threads(1)
    nano = nanogpt_module()
    task = small_task()
    lay = Layout(task.n_examples, task.seq_len, task.d_vocab, **SPECIAL)
    model_args = dict(
        n_layer=2, n_head=2, n_embd=8, block_size=lay.n_positions, bias=bias, vocab_size=None, dropout=0.1
    )
    model_args["vocab_size"] = lay.min_vocab + 2
    torch.manual_seed(0)
    with monkeypatch.context() as m:
        if not flash:
            m.delattr(torch.nn.functional, "scaled_dot_product_attention")
        model = nano.GPT(nano.GPTConfig(**model_args)).to(dtype)
    assert model.transformer.h[0].attn.flash == flash
    optimizer = model.configure_optimizers(0.1, 1e-2, (0.9, 0.95), "cpu")
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        x = torch.randint(0, model_args["vocab_size"], (4, lay.n_positions), generator=g)
        _, loss = model(x, x.roll(-1, 1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=dtype))
    model.eval()
    raw_model = torch.compile(model) if compiled else model
    checkpoint = {
        "model": raw_model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "model_args": model_args,
        "iter_num": 3,
        "best_val_loss": loss.detach(),
        "config": {"out_dir": "out", "compile": compiled, "bias": bias, "dtype": "float32"},
    }
    assert any(k.startswith("_orig_mod.") for k in checkpoint["model"]) == compiled
    assert any(k.endswith(".attn.bias") for k in checkpoint["model"]) == (not flash)
    torch.save(checkpoint, tmp_path / "ckpt.pt")
    write_task(tmp_path, task, SPECIAL)
    subject = load_subject(tmp_path / "ckpt.pt")  # no dtype: the file's own precision
    assert subject.model.cfg.torch_dtype == dtype
    tokens, _ = task.sample(6, torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = expected_log_probs(lambda ids: model(ids, ids)[0], tokens, task, SPECIAL)
    assert (subject.log_probs(tokens) - want).abs().max() < (1e-12 if dtype == torch.float64 else 1e-5)
    if dtype == torch.float64:  # asking for float64 keeps it, too
        assert (load_subject(tmp_path / "ckpt.pt", dtype="float64").log_probs(tokens) - want).abs().max() < 1e-12


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
TL_DATA = json.loads((Path(__file__).parent / "data" / "tl_config_fields.json").read_text())
TL_GROUPS = {g["releases"][-1]: g for g in TL_DATA["groups"]}  # the last release of each group names it
TL_RELEASES = [v for g in TL_DATA["groups"] for v in g["releases"]]


def tl_group(release: str) -> dict:
    return next(g for g in TL_DATA["groups"] if release in g["releases"])


def tl_cfg_dict(variant: str = "gelu LN", release: str = "2.18.0", **kw) -> dict:
    """What ``json.dump(cfg.to_dict(), default=str)`` of that TransformerLens release writes for the
    variant (``tests/models/loading/data/tl_config_fields.json``, read from the release's own config class), then ``kw``."""
    group = tl_group(release)
    cfg = {**{k: v for k, v in group["fields"].items()}, **group["to_dict"][variant]}
    assert "<required>" not in cfg.values()
    cfg.update(kw)
    return json.loads(json.dumps(cfg))


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
    dtype = torch.float64 if cfg["dtype"] == "torch.float64" else torch.float32
    state = randomize({k: torch.empty(s, dtype=dtype) for k, s in shapes.items()}, scale, seed)
    for i in range(cfg["n_layers"]):
        state[f"blocks.{i}.attn.mask"] = torch.ones(cfg["n_ctx"], cfg["n_ctx"], dtype=torch.bool).tril()
        state[f"blocks.{i}.attn.IGNORE"] = torch.tensor(-torch.inf)
    return state


def tl_attn_scale(cfg: dict, layer: int) -> float:
    """AbstractAttention.__init__ of TransformerLens 2.x/3.x: ``cfg.attn_scale`` (2.0.x: sqrt(d_head)) if
    ``use_attn_scale`` else 1, times layer + 1 with ``scale_attn_by_inverse_layer_idx``."""
    scale = cfg.get("attn_scale", math.sqrt(cfg["d_head"])) if cfg["use_attn_scale"] else 1.0
    return scale * (layer + 1) if cfg["scale_attn_by_inverse_layer_idx"] else scale


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
        scores = torch.einsum("bqne,bkne->bnqk", q, k) / tl_attn_scale(cfg, i)
        pattern = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        z = torch.einsum("bnqk,bkne->bqne", pattern, v)
        x = x + torch.einsum("bqne,ned->bqd", z, s[p + "W_O"]) + s[p + "b_O"]
        if not cfg["attn_only"]:
            m = f"blocks.{i}.mlp."
            pre = normalize(x, f"blocks.{i}.ln2") @ s[m + "W_in"] + s[m + "b_in"]
            x = x + act(pre) @ s[m + "W_out"] + s[m + "b_out"]
    return normalize(x, "ln_final") @ s["unembed.W_U"] + s["unembed.b_U"]


TL_CASES = {  # variant of tl_config_fields.json, ln weights saved, normalisation loaded, layout
    "attn-only LN": ("attn-only LN", True, "LN", "plain"),
    "gelu_new LNPre float64": ("gelu_new LNPre float64", False, "LNPre", "bos"),
    "relu no norm": ("relu no norm", False, None, "sep"),
    "gelu LN folded": ("gelu LN", False, "LNPre", "special"),  # LN config, ln weights folded away
    "gelu LN": ("gelu LN", True, "LN", "special"),
    "no attn scale": ("gelu no attn scale", True, "LN", "special"),  # attn_scale -1.0 written, divides by 1
}


@pytest.mark.parametrize("release", ["2.18.0", "3.9.0"])
@pytest.mark.parametrize("case", TL_CASES)
def test_transformer_lens_state_dict_matches_its_forward_pass(tmp_path, case, release):
    variant, with_ln, norm, layout = TL_CASES[case]
    task = small_task()
    cfg = tl_cfg_dict(variant, release)
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
    assert (subject.log_probs(tokens) - want).abs().max() < (1e-12 if float64 else 1e-5)
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
    cfg = tl_cfg_dict("gelu_new attn result")
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
    cfg = tl_cfg_dict("gelu LN")
    torch.save(tl_state(cfg, True), tmp_path / "model.pt")
    (tmp_path / "model.json").write_text(json.dumps({**cfg, **change}))
    write_task(tmp_path, task, SPECIAL)
    with pytest.raises(ValueError, match=message) as err:
        load_subject(tmp_path / "model.pt")
    assert "\n" not in str(err.value)


def _tl_load(folder, cfg: dict, with_ln: bool, layout: str = "special", seed: int = 0):
    """Write a TransformerLens state dict + cfg.to_dict() JSON + task.json; (subject, state, task)."""
    task = small_task()
    folder.mkdir(exist_ok=True)
    state = tl_state(cfg, with_ln, seed, scale=0.5 if cfg["normalization_type"] else 0.25)
    torch.save(state, folder / "model.pt")
    (folder / "model.json").write_text(json.dumps(cfg))
    write_task(folder, task, LAYOUTS[layout])
    return load_subject(folder / "model.pt"), state, task


@pytest.mark.parametrize("group", TL_GROUPS)
def test_every_release_config_loads_with_transformer_lens_numbers(tmp_path, group):
    """Each release's own cfg.to_dict() (every variant it can write) loads, and the log-probs match
    TransformerLens's forward pass: float32 rounding, 1e-12 in float64."""
    worst = {}
    for variant in TL_GROUPS[group]["to_dict"]:
        cfg = tl_cfg_dict(variant, group)
        norm = cfg["normalization_type"]
        subject, state, task = _tl_load(tmp_path / variant.replace(" ", "_"), cfg, with_ln=norm == "LN")
        tokens, _ = task.sample(6, torch.Generator().manual_seed(2))
        want = expected_log_probs(lambda ids: tl_logits(state, cfg, ids, norm), tokens, task, SPECIAL)
        worst[variant] = (subject.log_probs(tokens) - want).abs().max().item()
        assert worst[variant] < (1e-12 if cfg["dtype"] == "torch.float64" else 1e-5), (variant, worst[variant])
    assert len(worst) >= 6


def test_every_field_of_every_release_is_known_and_classified_once():
    fields = set().union(*(g["fields"] for g in TL_DATA["groups"]))
    assert fields - converters.KNOWN_FIELDS == set()
    classes = [
        converters.IGNORED_FIELDS, set(converters.REQUIRED_VALUES), set(converters.SOFT_CAPS),
        set(converters.MODEL_FIELDS), set(converters.CHECKED_FIELDS),
    ]  # fmt: skip
    assert sum(len(c) for c in classes) == len(set().union(*classes))
    # Every field a release writes at a value other than what it covers is one TransformerLens itself
    # writes at that covered value by default.
    latest = TL_DATA["groups"][-1]["fields"]
    for field, allowed in converters.REQUIRED_VALUES.items():
        assert latest[field] == allowed[0], field


@pytest.mark.parametrize("field", sorted(tl_group("3.9.0")["fields"].keys() & set(converters.REQUIRED_VALUES)))
def test_a_field_that_changes_the_forward_pass_is_refused_by_name(tmp_path, field):
    default = tl_group("3.9.0")["fields"][field]
    value = {False: True, None: 2, "causal": "bidirectional"}[default]
    with pytest.raises(ValueError, match=rf"{field}={value!r} is not covered; covered: {default!r}") as err:
        _tl_load(tmp_path, tl_cfg_dict("gelu LN", "3.9.0", **{field: value}), with_ln=True)
    assert "\n" not in str(err.value)


def test_fields_that_do_not_change_the_forward_pass_are_accepted_at_any_value(tmp_path):
    cfg = tl_cfg_dict("gelu LN", "3.9.0")
    base, _, task = _tl_load(tmp_path / "a", cfg, with_ln=True)
    changed = dict(
        seed=3, model_name="mine", use_hook_mlp_in=True, use_split_qkv_input=True, use_attn_in=True,
        rotary_base=99, train_seq_length=16, yarn_truncate=False, yarn_global_attn_only=True,
        use_dynamic_ntk_rope=True, init_mode="xavier_normal", initializer_range=0.1, tokenizer_name="gpt2",
    )  # fmt: skip
    other, _, _ = _tl_load(tmp_path / "b", {**cfg, **changed}, with_ln=True)
    tokens, _ = task.sample(6, torch.Generator().manual_seed(2))
    assert torch.equal(base.log_probs(tokens), other.log_probs(tokens))


@pytest.mark.parametrize("release", ["2.0.0", "3.9.0"])
def test_scale_by_inverse_layer_index_is_computed_as_transformer_lens_does(tmp_path, release):
    cfg = tl_cfg_dict("gelu LN", release, scale_attn_by_inverse_layer_idx=True, n_layers=3)
    subject, state, task = _tl_load(tmp_path, cfg, with_ln=True)
    tokens, _ = task.sample(6, torch.Generator().manual_seed(2))
    want = expected_log_probs(lambda ids: tl_logits(state, cfg, ids, "LN"), tokens, task, SPECIAL)
    unscaled = expected_log_probs(
        lambda ids: tl_logits(state, {**cfg, "scale_attn_by_inverse_layer_idx": False}, ids, "LN"),
        tokens,
        task,
        SPECIAL,
    )
    assert (subject.log_probs(tokens) - want).abs().max() < 1e-5 < (want - unscaled).abs().max()


def test_transformer_lens_state_dict_errors(tmp_path):
    task = small_task()
    cfg = tl_cfg_dict("gelu LN")
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
    """docs/paper.md section 3 taken literally, as a user would write it: per head ``w^H`` (2H-1 offsets) and
    ``w^L`` (L entries), the copyers' softmax over the demonstrations only; ``W_KQ`` (Kd x Kd) between
    the copies at key h' and query h; values ``softmax(x_h' W_OV)`` from the target token (d x d); no
    root bias (a uniform prior for x_0). Initialised as docs/paper.md section 5: w^H +1 at offset 0, -1
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
    from probes.layout import Layout

    lay = Layout(task.n_examples, task.seq_len, task.d_vocab, **layout)
    hf = save_random_gpt2(
        folder, task, layout, vocab_size=lay.min_vocab + 1, n_positions=lay.n_positions,
        bos_token_id=layout.get("bos", 0), eos_token_id=0,
    )  # fmt: skip
    return {k: v.detach().clone() for k, v in hf.state_dict().items()}, hf.config


def save_random_gpt2(folder, task, layout: dict, **kw):
    """A GPT-2 of ``GPT2Config(**kw)`` (small defaults, no dropout), weights N(0, 0.4), saved by
    ``save_pretrained`` with task.json; returns the model."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        **{**dict(vocab_size=8, n_positions=20, n_embd=8, n_layer=2, n_head=2), **kw},
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.4)
    hf.save_pretrained(folder)
    write_task(folder, task, layout)
    return hf


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


GPT2_ACTS = ["relu", "gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python", "silu", "quick_gelu", "tanh", "sigmoid", "mish"]  # fmt: skip
GPT2_FLAGS = {
    "defaults": {},
    "scale_attn_weights=false": dict(scale_attn_weights=False),
    "scale_attn_by_inverse_layer_idx": dict(scale_attn_by_inverse_layer_idx=True, n_layer=3),
    "both scalings off/on": dict(scale_attn_weights=False, scale_attn_by_inverse_layer_idx=True, n_layer=3),
    "reorder_and_upcast_attn": dict(reorder_and_upcast_attn=True),
    "layer_norm_epsilon": dict(layer_norm_epsilon=1e-3),
    "n_inner": dict(n_inner=12),
    "untied head": dict(tie_word_embeddings=False),
    "add_cross_attention": dict(add_cross_attention=True),
    **{f"activation {a}": dict(activation_function=a) for a in GPT2_ACTS},
    "unscaled, gelu, n_inner, eps, untied": dict(
        scale_attn_weights=False,
        activation_function="gelu",
        n_inner=12,
        layer_norm_epsilon=1e-3,
        tie_word_embeddings=False,
    ),  # fmt: skip
    "unscaled, relu": dict(scale_attn_weights=False, activation_function="relu"),
    "unscaled, gelu_pytorch_tanh, reorder": dict(
        scale_attn_weights=False, activation_function="gelu_pytorch_tanh", reorder_and_upcast_attn=True
    ),
}


def save_gpt2_config(folder, **kw):
    """A random GPT-2 of ``GPT2Config(**kw)`` with a plain task.json; returns the task."""
    task = small_task()
    save_random_gpt2(folder, task, {}, **kw)
    return task


@pytest.mark.parametrize("flags", GPT2_FLAGS)
def test_every_gpt2_config_flag_matches_transformers_own_forward(tmp_path, flags):
    """transformers' GPT2LMHeadModel (eager attention, float64) on the saved folder against what the suite
    loads from it; reorder_and_upcast_attn computes in float32 inside transformers, so in float32 there."""
    from transformers import GPT2LMHeadModel

    torch.set_num_threads(1)
    kw = GPT2_FLAGS[flags]
    save_gpt2_config(tmp_path / "hf", **kw)
    dtype = "float32" if kw.get("reorder_and_upcast_attn") else "float64"
    ours = models_load(tmp_path / "hf", dtype=dtype)
    ref = GPT2LMHeadModel.from_pretrained(tmp_path / "hf", attn_implementation="eager", dtype=getattr(torch, dtype))
    ids = torch.randint(0, 8, (3, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = ref.eval()(ids).logits.log_softmax(-1)
        got = ours(ids).log_softmax(-1)
    assert (got - want).abs().max() < (1e-12 if dtype == "float64" else 1e-5)
    if kw.get("scale_attn_weights") is False:  # the bridge would divide by sqrt(head_dim): loaded apart
        assert isinstance(ours, HookedTransformer) and not ours.cfg.use_attn_scale


def test_gpt2_scale_attn_weights_false_is_the_saved_model_in_the_subject(tmp_path):
    from transformers import GPT2LMHeadModel

    task = save_gpt2_config(tmp_path / "hf", scale_attn_weights=False, vocab_size=8)
    subject = load_subject(tmp_path / "hf", dtype="float64")
    ref = GPT2LMHeadModel.from_pretrained(tmp_path / "hf", attn_implementation="eager", dtype=torch.float64).eval()
    tokens, _ = task.sample(6, torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = expected_log_probs(lambda ids: ref(ids).logits, tokens, task, {})
    assert (subject.log_probs(tokens) - want).abs().max() < 1e-12
    assert subject.family == "standard" and subject.n_heads == [2, 2]


def test_gpt2_flags_the_unscaled_path_does_not_cover_are_refused_by_name(tmp_path):
    save_gpt2_config(tmp_path / "hf", scale_attn_weights=False, activation_function="silu")
    with pytest.raises(
        ValueError, match="scale_attn_weights=false with activation_function='silu' is not covered"
    ) as err:
        load_subject(tmp_path / "hf")
    assert "\n" not in str(err.value)


def test_a_hugging_face_weight_file_passed_instead_of_its_folder_says_pass_the_folder(tmp_path):
    save_gpt2_config(tmp_path / "hf")
    for call in (load_subject, models_load, models.load_task):
        with pytest.raises(
            ValueError,
            match=rf"weight file of a Hugging Face model .* pass the folder .*--checkpoint {tmp_path / 'hf'}$",
        ):
            call(tmp_path / "hf" / "model.safetensors")


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
    from probes.layout import Layout

    task = small_task()
    path, _, _ = write_nanogpt(tmp_path / "nanogpt", task, SPECIAL)
    r = run_inspect(tmp_path / "nanogpt", ["--checkpoint", str(path)])
    assert r["kind"] == "standard" and len(r["heads"]) == 4
    cfg = tl_cfg_dict("gelu_new attn result")
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
    # A GPT-2 without attention scaling (loaded apart from the bridge): inspected as the model saved.
    lay = Layout(task.n_examples, task.seq_len, task.d_vocab, **SPECIAL)
    save_random_gpt2(
        tmp_path / "unscaled" / "model", task, SPECIAL, vocab_size=lay.min_vocab, n_positions=lay.n_positions,
        scale_attn_weights=False,
    )  # fmt: skip
    r = run_inspect(tmp_path / "unscaled", ["--checkpoint", str(tmp_path / "unscaled" / "model")])
    assert r["kind"] == "standard" and len(r["heads"]) == 4 and r["on_plateau"] and r["parent_selecting"] == []


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
    cfg = tl_cfg_dict("gelu LN")
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
