"""The TransformerLens idioms a user reaches for, on every model family the suite hooks: the shipped
checkpoint, the Theorem 1 construction (both ``CausalTransformer``) and a tiny Hugging Face GPT-2 booted
through ``transformer_lens.TransformerBridge``. Each either gives the right result, checked against a
computation written here, or fails at once with one line that names what to use instead."""

from __future__ import annotations

import copy
import io

import pytest
import torch
import torch.nn.functional as F
from test_formats import hf_folder
from transformer_lens import ActivationCache, patching

import models
from models.interp import patching as suite_patching
from models.nets.causal_transformer import RESULT_HOOK
from tests.conftest import build_task

OURS = ("checkpoint", "theorem1")


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    """name -> (model, tokens): 8 contexts of the model's own task."""
    task = models.load_task(models.DEFAULT_CHECKPOINT)
    tokens, _ = task.sample(8, torch.Generator().manual_seed(0))
    exact = models.theorem1_model(task.pi, task.n_examples, task.seq_len, beta=50.0)
    folder, _, small = hf_folder(tmp_path_factory.mktemp("hf"), build_task(d_vocab=4, n_examples=3, seq_len=5), "gpt2")
    bridge_tokens, _ = small.sample(4, torch.Generator().manual_seed(0))
    return {
        "checkpoint": (models.load(models.DEFAULT_CHECKPOINT), tokens),
        "theorem1": (exact, tokens),
        "bridge": (models.load(folder), bridge_tokens),
    }


def one_line(error: type, call, *names: str) -> str:
    """``call()`` raises ``error`` with a one-line message naming each of ``names``."""
    with pytest.raises(error) as e:
        call()
    message = str(e.value)
    assert "\n" not in message, message
    for name in names:
        assert name in message, message
    return message


def output(model, tokens):
    out = model(tokens)
    return out if isinstance(out, torch.Tensor) else out.logits


# --- .to(dtype / device) ---------------------------------------------------------------------------
@pytest.mark.parametrize("family", [*OURS, "bridge"])
def test_to_float64_keeps_cfg_true_and_the_output(families, family):
    model, tokens = families[family]
    with torch.no_grad():
        want = output(copy.deepcopy(model).float(), tokens).double()
        wide = copy.deepcopy(model).to(torch.float64)
        assert all(p.dtype == torch.float64 for p in wide.parameters())
        assert wide.cfg.dtype in ("float64", torch.float64)
        # float32 against float64: agreement to float32's own rounding (about 16 ulp of each log-prob)
        torch.testing.assert_close(output(wide, tokens), want, rtol=2e-6, atol=1e-6)
        if family in OURS:
            assert copy.deepcopy(model).double().cfg.dtype == "float64"


@pytest.mark.parametrize("family", OURS)
def test_half_bfloat16_meta_and_back(families, family):
    model, tokens = families[family]
    with torch.no_grad():
        want = copy.deepcopy(model).float()(tokens)
        for convert, name, tol in ((lambda m: m.half(), "float16", 1e-2), (lambda m: m.bfloat16(), "bfloat16", 1e-1)):
            narrow = convert(copy.deepcopy(model))
            got = narrow(tokens)
            assert narrow.cfg.dtype == name and got.dtype == narrow.b_root.dtype
            assert (got.float() - want).abs().max() < tol
        meta = copy.deepcopy(model).to("meta")
        assert meta.cfg.device == "meta" and all(p.is_meta for p in meta.parameters())
        back = meta.to_empty(device="cpu")
        assert back.cfg.device == "cpu"
        assert models.CausalTransformerConfig.from_dict(back.cfg.to_dict()) == back.cfg  # still a valid config
        moved = copy.deepcopy(model).to(torch.device("cpu"), torch.float32)
        assert (moved.cfg.device, moved.cfg.dtype) == ("cpu", "float32")


# --- stacking and decomposing the residual ------------------------------------------------------
@pytest.mark.parametrize("family", [*OURS, "bridge"])
def test_stack_activation_and_accumulated_resid(families, family):
    model, tokens = families[family]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    assert isinstance(cache, ActivationCache)
    if family == "bridge":  # TransformerLens's own: every layer alike
        n = model.cfg.n_layers
        torch.testing.assert_close(
            cache.stack_activation("pattern"), torch.stack([cache["pattern", l] for l in range(n)])
        )
        parts = [cache["resid_pre", l] for l in range(n)] + [cache["resid_post", n - 1]]
        torch.testing.assert_close(cache.accumulated_resid(), torch.stack(parts))
        return
    one_line(ValueError, lambda: cache.stack_activation("pattern"), "cache['pattern', 0]", "cache['pattern', 1]")
    one_line(ValueError, cache.accumulated_resid, "decompose_resid")
    one_line(ValueError, cache.logit_lens, "logit_attrs")
    one_line(ValueError, lambda: cache.apply_ln_to_stack(torch.zeros(1)), "LayerNorm")


@pytest.mark.parametrize("family", OURS)
def test_decompose_resid_and_head_results_sum_to_the_residual(families, family):
    model, tokens = families[family]
    cfg = model.cfg
    K, H, d, D = cfg.n_copy_heads, cfg.seq_len, cfg.d_vocab, cfg.d_model
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    resid = cache["blocks.0.hook_resid_post"]
    token = F.pad(F.one_hot(tokens[:, -H:], d).to(resid.dtype), (0, D - d))  # x_h in subspace 0, by hand
    stack, labels = cache.decompose_resid(return_labels=True)
    assert labels == ["embed", "0_attn_out"]
    torch.testing.assert_close(stack[0], token, rtol=0, atol=0)
    torch.testing.assert_close(stack.sum(0), resid, rtol=0, atol=0)
    heads, head_labels = cache.stack_head_results(incl_remainder=True, return_labels=True)
    assert head_labels == [f"L0H{k}" for k in range(K)] + ["remainder"]
    z = cache["blocks.0.attn.hook_z"]
    for k in range(K):  # head k's piece is its copy, in subspace k+1 alone
        assert torch.equal(heads[k].view(*resid.shape[:2], K + 1, d)[:, :, k + 1], z[:, :, k])
        assert heads[k].count_nonzero() == heads[k][..., (k + 1) * d : (k + 2) * d].count_nonzero()
    torch.testing.assert_close(heads[-1], token, rtol=0, atol=0)
    pieces, piece_labels = model.decompose_resid(cache)
    assert piece_labels == ["token", *head_labels[:-1]] and torch.equal(pieces.sum(0), resid)
    one_line(ValueError, lambda: cache.decompose_resid(layer=2), "layer=1")
    one_line(ValueError, lambda: cache.stack_head_results(apply_ln=True), "LayerNorm")
    # compute_head_results caches what the forward computes with cfg.use_attn_result on
    cache.compute_head_results()
    on = copy.deepcopy(model)
    on.cfg.use_attn_result = True
    with torch.no_grad():
        _, full = on.run_with_cache(tokens, names_filter=[RESULT_HOOK])
    torch.testing.assert_close(cache[RESULT_HOOK], full[RESULT_HOOK], rtol=0, atol=0)
    # logit_attrs: each piece's share of the value logits resid @ W_OV, which sum to them
    target = tokens[:, -H:]
    attrs = cache.logit_attrs(pieces, target)
    value_logits = (resid @ model.W_OV).gather(-1, target[..., None])[..., 0]
    torch.testing.assert_close(attrs.sum(0), value_logits)
    one_line(ValueError, lambda: cache.logit_attrs(cache["blocks.1.attn.hook_z"], target), "(K+1)d")


def test_bridge_decompositions_are_transformer_lens_own(families):
    model, tokens = families["bridge"]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    n, heads = model.cfg.n_layers, model.cfg.n_heads
    stack = cache.decompose_resid()
    torch.testing.assert_close(stack.sum(0), cache["resid_post", n - 1], rtol=0, atol=1e-5)
    results, labels = cache.stack_head_results(return_labels=True)
    assert labels == [f"L{l}H{h}" for l in range(n) for h in range(heads)]
    for l in range(n):  # a layer's heads sum to its attention output, less the bias
        bias = model.blocks[l].attn.b_O
        torch.testing.assert_close(
            results[l * heads : (l + 1) * heads].sum(0) + bias, cache["attn_out", l], rtol=0, atol=1e-5
        )
    assert cache.logit_attrs(stack, tokens[:, -1]).shape == (len(stack), *tokens.shape)


# --- patching -------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", [*OURS, "bridge"])
def test_get_act_patch_helpers(families, family):
    model, tokens = families[family]
    clean, corrupted = tokens, tokens.flip(0)
    with torch.no_grad():
        _, cache = model.run_with_cache(clean)

    def metric(out):
        return output_of(out)[:, -1].sum()

    if family == "bridge":  # TransformerLens's own helpers work: the same as a hand loop
        got = patching.get_act_patch_attn_head_out_all_pos(model, corrupted, cache, metric)
        for l in range(model.cfg.n_layers):
            for h in range(model.cfg.n_heads):

                def patch(z, hook, l=l, h=h):
                    z = z.clone()
                    z[:, :, h] = cache["z", l][:, :, h]
                    return z

                with torch.no_grad():
                    want = metric(model.run_with_hooks(corrupted, fwd_hooks=[(f"blocks.{l}.attn.hook_z", patch)]))
                assert got[l, h].item() == pytest.approx(want.item(), abs=1e-5)
        return
    # TransformerLens's helpers index every layer by cfg.n_heads and the input length: one line at the first
    # cell that does not fit, naming what to use instead
    for helper in (
        patching.get_act_patch_attn_head_out_all_pos,
        patching.get_act_patch_attn_head_pattern_by_pos,
        patching.get_act_patch_resid_pre,
    ):
        one_line(ValueError, lambda: helper(model, corrupted, cache, metric), "models.interp.patching", "index_df")
    one_line(KeyError, lambda: patching.get_act_patch_mlp_out(model, corrupted, cache, metric), "no such part")
    # the same sweep through the suite's generic_activation_patch is refused before any forward pass
    K = model.cfg.n_copy_heads
    every_layer = patching.make_df_from_ranges([model.cfg.n_layers, K], ["layer", "head_index"])
    runs = []
    model.hook_log_probs.add_hook(lambda act, hook: runs.append(1))
    try:
        one_line(
            ValueError,
            lambda: suite_patching.generic_activation_patch(
                model, corrupted, cache, metric, patching.layer_head_vector_patch_setter, "z", every_layer
            ),
            "head_index=",
            "index_df",
        )
    finally:
        model.reset_hooks()
    assert runs == [], "a refused sweep ran forward passes first"


def output_of(out):
    return out if isinstance(out, torch.Tensor) else out.logits


# --- hooks and caching ---------------------------------------------------------------------------
@pytest.mark.parametrize("family", [*OURS, "bridge"])
def test_catch_all_hooks_and_add_caching_hooks(families, family):
    model, tokens = families[family]
    seen = set()
    with torch.no_grad():
        plain = output(model, tokens)
        out = model.run_with_hooks(tokens, fwd_hooks=[(lambda name: True, lambda act, hook: seen.add(hook.name))])
        torch.testing.assert_close(output_of(out), plain, rtol=0, atol=0)
        _, cached = model.run_with_cache(tokens)
        caches = []
        for add in (lambda c: model.add_caching_hooks(cache=c), lambda c: model.cache_all(c)):
            caches.append({})
            add(caches[-1])
            try:
                output(model, tokens)
            finally:
                model.reset_hooks()
    if family in OURS:
        assert seen == set(model.hook_dict) - {RESULT_HOOK}
    for c in caches:  # the bridge's run_with_cache adds alias names (blocks.0.attn.hook_z, ...) on top
        assert set(c) == set(cached.keys()) if family in OURS else set(c) < set(cached.keys())
        assert all(torch.equal(c[k], cached[k]) for k in c)


@pytest.mark.parametrize("family", [*OURS, "bridge"])
def test_a_mistyped_hook_name_is_one_line(families, family):
    model, tokens = families[family]
    typo = "blocks.1.attn.hook_patern"
    error = ValueError if family in OURS else KeyError  # the bridge's own: a one-line KeyError
    one_line(error, lambda: model.run_with_cache(tokens, names_filter=typo), typo)
    if family in OURS:
        one_line(ValueError, lambda: model.run_with_cache(tokens, names_filter=[typo]), "blocks.1.attn.hook_pattern")
        one_line(
            ValueError, lambda: model.run_with_hooks(tokens, fwd_hooks=[(typo, lambda a, hook: None)]), "hook_pattern"
        )
        one_line(ValueError, lambda: model.run_with_cache(tokens, names_filter=[RESULT_HOOK]), "use_attn_result")


@pytest.mark.parametrize("family", [*OURS, "bridge"])
def test_incl_bwd_with_return_type_loss(families, family):
    model, tokens = families[family]
    model.zero_grad(set_to_none=True)
    loss, cache = model.run_with_cache(tokens, incl_bwd=True, return_type="loss")
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        out = output(model, tokens)
    if family == "bridge":  # next-token cross-entropy over the whole sequence
        want = F.cross_entropy(out[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
        torch.testing.assert_close(loss, want, rtol=0, atol=1e-5)
        return
    H = model.cfg.seq_len
    target = tokens[:, -H:, None]
    torch.testing.assert_close(loss, -out.gather(-1, target)[:, 1:].mean())
    # d loss / d log_probs: -1/(batch (H-1)) at each target token of rows h >= 1, 0 elsewhere
    want = torch.zeros_like(out).scatter_(-1, target, -1.0 / (len(tokens) * (H - 1)))
    want[:, 0] = 0
    torch.testing.assert_close(cache["hook_log_probs_grad"], want, rtol=0, atol=1e-12)
    assert model(tokens, return_type=None) is None
    one_line(ValueError, lambda: model.run_with_cache(tokens, incl_bwd=True), "return_type='loss'")
    one_line(ValueError, lambda: model(tokens, return_type="logits"), "log_probs")


@pytest.mark.parametrize("family", [*OURS, "bridge"])
def test_writing_into_the_cached_pattern(families, family):
    model, tokens = families[family]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    pattern = cache["pattern", 0]
    if family == "bridge":  # per-context tensors: a write touches its context only
        before = pattern[1:].clone()
        pattern[0] += 1
        assert torch.equal(pattern[1:], before)
        return
    assert pattern.stride(0) == 0, "the cached copyer pattern should cost no memory per context"
    before = pattern[1].clone()

    def write():
        pattern[0] += 1

    one_line(ValueError, write, "clone")
    one_line(ValueError, lambda: pattern[0].zero_(), "clone")
    one_line(ValueError, lambda: cache["attn_scores", 0].__setitem__((0, 0), 0.0), "clone")
    assert torch.equal(pattern[1], before)
    copied = pattern.clone()
    copied[0] += 1  # a clone is an ordinary, per-context tensor
    assert torch.equal(pattern[1], before) and not torch.equal(copied[0], pattern[0])
    assert type(pattern * 2) is torch.Tensor  # results of reading it are plain tensors
    saved = io.BytesIO()
    torch.save(cache.cache_dict, saved)  # a cache saves and loads (weights_only) as plain tensors
    saved.seek(0)
    loaded = torch.load(saved, weights_only=True)["blocks.0.attn.hook_pattern"]
    assert type(loaded) is torch.Tensor and torch.equal(loaded, pattern)
    # a hook that writes in place gets the same one line; one that returns an edited clone is honoured
    one_line(
        ValueError,
        lambda: model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_pattern", lambda p, hook: p.mul_(0))]),
        "clone",
    )

    def only_context_0(p, hook):
        p = p.clone()
        p[0] = p[0].roll(1, dims=-1)
        return p

    with torch.no_grad():
        plain = model(tokens)
        edited = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_pattern", only_context_0)])
    # the other contexts agree to rounding (a per-context pattern takes the batched einsum)
    torch.testing.assert_close(edited[1:], plain[1:], rtol=0, atol=1e-6)
    assert (edited[0] - plain[0]).abs().max() > 1e-3
