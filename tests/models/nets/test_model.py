"""The hooked model against a NumPy reference forward pass, hook by hook, plus its invariants."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformer_lens import ActivationCache
from transformer_lens.patching import generic_activation_patch

import models
from models import CausalTransformer, CausalTransformerConfig
from probes import bma_posterior, bma_predictive
from tests.conftest import build_task


def random_model(d=4, L=3, H=5, K=None, dtype="float64", seed=0) -> CausalTransformer:
    model = CausalTransformer(CausalTransformerConfig(d, L, H, K, dtype=dtype))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model.eval()


def softmax(x, axis=-1):
    x = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def numpy_forward(model: CausalTransformer, tokens: np.ndarray) -> dict[str, np.ndarray]:
    """docs/paper.md section 3 written out with loops where they make the maths plain."""
    cfg = model.cfg
    d, L, H, K = cfg.d_vocab, cfg.n_examples, cfg.seq_len, cfg.n_copy_heads
    w_H = model.blocks[0].attn.w_H.detach().numpy()
    w_L = model.blocks[0].attn.w_L.detach().numpy()
    W_KQ, W_OV = model.W_KQ.detach().numpy(), model.W_OV.detach().numpy()
    b_root = model.b_root.detach().numpy()
    B, T = tokens.shape
    x = np.eye(d)[tokens]  # [B, T, d]
    scores = np.full((K, H, T), -np.inf)
    for k in range(K):
        for h in range(H):
            for l in range(L + 1):
                for hp in range(H):
                    if l == L and hp >= h:
                        continue  # the target's own tokens at or after h are not visible
                    scores[k, h, l * H + hp] = w_H[k, hp - h + H - 1] + w_L[k, l]
    pattern = softmax(scores)
    u = np.einsum("khT,bTd->bhkd", pattern, x)
    resid = np.concatenate([x[:, L * H :], u.reshape(B, H, K * d)], -1)
    q = resid.copy()
    q[:, :, :d] = 0
    s2 = np.einsum("bjD,DE,biE->bij", resid, W_KQ, q)  # [b, query i, key j]
    pat2 = np.zeros_like(s2)
    for i in range(1, H):
        pat2[:, i, :i] = softmax(s2[:, i, :i])
    values = softmax(resid @ W_OV)  # [b, key, d]
    mix = np.einsum("bij,bjd->bid", pat2, values)
    log_probs = np.log(np.where(np.arange(H)[None, :, None] == 0, 1.0, mix))
    log_probs[:, 0] = np.log(softmax(b_root))
    return {
        "hook_embed": x,
        "blocks.0.attn.hook_pattern": np.broadcast_to(pattern, (B, K, H, T)),
        "blocks.0.attn.hook_z": u,
        "blocks.0.hook_resid_post": resid,
        "blocks.1.attn.hook_q": q[:, :, None],
        "blocks.1.attn.hook_k": resid[:, :, None],
        "blocks.1.attn.hook_pattern": pat2[:, None],
        "blocks.1.attn.hook_v": np.log(values)[:, :, None],
        "blocks.1.attn.hook_z": mix[:, :, None],
        "hook_log_probs": log_probs,
    }


@pytest.mark.parametrize("K", [None, 2, 5])
def test_forward_and_every_hook_match_numpy_reference(K):
    model = random_model(K=K)
    tokens, _ = build_task().sample(6)
    log_probs, cache = model.run_with_cache(tokens)
    assert isinstance(cache, ActivationCache)
    ref = numpy_forward(model, tokens.numpy())
    for name, want in ref.items():
        got = cache[name].detach().numpy()
        assert got.shape == want.shape, name
        finite = np.isfinite(want)
        np.testing.assert_allclose(got[finite], want[finite], rtol=1e-10, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(log_probs.detach().numpy(), ref["hook_log_probs"], rtol=1e-10, atol=1e-12)
    # the blocks.0 scores are -inf exactly on the target's own keys h' >= h
    L, H = model.cfg.n_examples, model.cfg.seq_len
    masked = torch.zeros(H, (L + 1) * H, dtype=torch.bool)
    masked[:, L * H :] = torch.ones(H, H, dtype=torch.bool).triu()
    assert torch.equal(torch.isneginf(cache["blocks.0.attn.hook_attn_scores"][0, 0]), masked)


@pytest.mark.parametrize("K", [None, 5])
def test_factored_copies_match_numpy_and_the_gradients_through_the_pattern(K):
    """At a size where blocks.0 computes its copies factored (no [K, H, (L+1)H] pattern formed): the
    plain and the hooked forward against NumPy, and the copyers' gradients against the dense path's
    (a hook returning a per-context pattern forces the dense contraction)."""
    model = random_model(d=3, L=16, H=8, K=K)
    assert model.blocks[0].attn.factored and not random_model().blocks[0].attn.factored
    tokens, _ = build_task(d_vocab=3, n_examples=16, seq_len=8).sample(4)
    ref = numpy_forward(model, tokens.numpy())
    plain = model(tokens)
    np.testing.assert_allclose(plain.detach().numpy(), ref["hook_log_probs"], rtol=1e-10, atol=1e-12)
    out, cache = model.run_with_cache(tokens)
    assert torch.equal(out, plain), "caching the copyer pattern changed the output"
    np.testing.assert_allclose(
        cache["blocks.0.attn.hook_z"].numpy(), ref["blocks.0.attn.hook_z"], rtol=1e-10, atol=1e-12
    )
    attn = model.blocks[0].attn

    def copyer_grads():
        return torch.autograd.grad(model(tokens, return_type="loss"), [attn.w_H, attn.w_L])

    factored = copyer_grads()
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", lambda p, hook: p.clone())]):
        dense = copyer_grads()
    for f, g in zip(factored, dense):
        assert g.abs().max() > 1e-3
        torch.testing.assert_close(f, g, rtol=1e-10, atol=1e-12)


def test_per_head_results_sum_to_the_residual_and_turning_them_on_changes_nothing():
    model = random_model()
    tokens, _ = build_task().sample(5)
    plain = model(tokens)
    assert "blocks.0.attn.hook_result" not in model.run_with_cache(tokens)[1]
    with pytest.raises(ValueError, match="use_attn_result"):  # a hook on it while off is an error, not a no-op
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_result", lambda act, hook: None)])
    model.cfg.use_attn_result = True
    out, cache = model.run_with_cache(tokens)
    assert torch.equal(out, plain), "computing per-head results changed the output"
    d = model.cfg.d_vocab
    token_part = torch.nn.functional.pad(cache["hook_embed"][:, -model.cfg.seq_len :], (0, model.cfg.d_model - d))
    torch.testing.assert_close(
        token_part + cache["blocks.0.attn.hook_result"].sum(2), cache["blocks.0.hook_resid_post"], rtol=0, atol=0
    )
    # head k writes only its own subspace k+1
    result = cache["blocks.0.attn.hook_result"].view(5, model.cfg.seq_len, model.cfg.n_heads, -1, d)
    for k in range(model.cfg.n_heads):
        others = [j for j in range(model.cfg.n_heads + 1) if j != k + 1]
        assert torch.all(result[:, :, k, others] == 0)


def test_no_leak_prediction_at_h_ignores_target_tokens_at_and_after_h():
    model = random_model(d=4, L=3, H=6)
    task = build_task(n_examples=3, seq_len=6)
    tokens, _ = task.sample(8)
    base = model(tokens)
    g = torch.Generator().manual_seed(1)
    for h in range(6):
        changed = tokens.clone()
        changed[:, 3 * 6 + h :] = torch.randint(0, 4, (8, 6 - h), generator=g)
        out = model(changed)
        assert torch.equal(out[:, : h + 1], base[:, : h + 1]), f"prediction at {h} saw target tokens >= {h}"
        if h < 5:  # and the perturbation is visible later, so the test could fail
            assert not torch.equal(out, base)


def test_layer1_pattern_costs_no_per_context_memory():
    model = random_model()
    tokens, _ = build_task().sample(7)
    _, cache = model.run_with_cache(tokens)
    assert cache["blocks.0.attn.hook_pattern"].stride(0) == 0


def test_run_with_hooks_intervenes_and_leaves_no_hook_behind():
    model = random_model()
    tokens, _ = build_task().sample(4)
    base = model(tokens)

    def zero_head_0(z, hook):
        z = z.clone()
        z[:, :, 0] = 0
        return z

    ablated = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_z", zero_head_0)])
    assert not torch.allclose(ablated, base)
    assert torch.equal(model(tokens), base)
    assert all(not hp.fwd_hooks for hp in model.hook_dict.values())


def test_hooks_are_removed_after_an_exception_inside_a_hook():
    model = random_model()
    tokens, _ = build_task().sample(2)

    def boom(act, hook):
        raise RuntimeError("inside hook")

    with pytest.raises(RuntimeError, match="inside hook"):
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_pattern", boom)])
    assert all(not hp.fwd_hooks for hp in model.hook_dict.values())
    with pytest.raises(RuntimeError, match="inside hook"):
        with model.hooks(fwd_hooks=[("hook_embed", boom)]):
            model(tokens)
    assert all(not hp.fwd_hooks for hp in model.hook_dict.values())


def test_generic_activation_patch_runs_and_self_patching_gives_metric_one():
    import pandas as pd

    model = random_model()
    task = build_task()
    clean, _ = task.sample(4, torch.Generator().manual_seed(0))
    corrupted, _ = task.sample(4, torch.Generator().manual_seed(1))
    corrupted[:, -task.seq_len :] = clean[:, -task.seq_len :]  # same target, other demonstrations
    clean_out, clean_cache = model.run_with_cache(clean)
    corrupted_out = model(corrupted)
    target = clean[:, -task.seq_len :]

    def metric(log_probs):
        lp = lambda o: o.gather(-1, target.unsqueeze(-1))[:, 1:].mean()  # noqa: E731
        return (lp(log_probs) - lp(corrupted_out)) / (lp(clean_out) - lp(corrupted_out))

    index_df = pd.DataFrame({"layer": [0] * model.cfg.n_heads, "head": range(model.cfg.n_heads)})

    def setter(act, index, clean_act):
        act[:, :, index[1]] = clean_act[:, :, index[1]]
        return act

    per_head = generic_activation_patch(model, corrupted, clean_cache, metric, setter, "z", index_df=index_df)
    assert per_head.shape == (model.cfg.n_heads,) and torch.isfinite(per_head).all()

    def all_heads(act, index, clean_act):
        return clean_act.clone()

    everything = generic_activation_patch(
        model, corrupted, clean_cache, metric, all_heads, "z", index_df=pd.DataFrame({"layer": [0]})
    )
    torch.testing.assert_close(everything, torch.ones(1), atol=1e-6, rtol=0)
    itself = generic_activation_patch(
        model, clean, clean_cache, metric, all_heads, "z", index_df=pd.DataFrame({"layer": [0]})
    )
    torch.testing.assert_close(itself, torch.ones(1), atol=1e-6, rtol=0)


def test_theorem1_attention_is_the_bma_posterior_and_error_shrinks_with_beta():
    task = build_task(d_vocab=5, n_examples=6, seq_len=8, seed=4)
    tokens, _ = task.sample(64, torch.Generator().manual_seed(2))
    post = bma_posterior(task.pi, tokens, 6, 8)
    pred = bma_predictive(task.pi, tokens, 6, 8, task.root)
    errors = []
    for beta in [0.5, 1, 2, 4, 8, 16, 50]:
        model = models.theorem1_model(task.pi, 6, 8, beta, task.root)
        log_probs, cache = model.run_with_cache(tokens)
        attn = cache["blocks.1.attn.hook_pattern"][:, 0]
        errors.append(max((attn - post).abs().max().item(), (log_probs.exp() - pred).abs().max().item()))
    assert errors[-1] < 1e-6
    assert errors[-1] < 1e-12, "at beta = 50 the copies are exact to float64 precision"
    assert all(a > b for a, b in zip(errors[:-2], errors[1:-1])), f"error not shrinking with beta: {errors}"


def test_theorem1_rejects_zeros_in_pi():
    pi = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    with pytest.raises(ValueError, match="zero entries"):
        models.theorem1_model(pi, 2, 3, 10.0)


def test_config_round_trip_and_bad_values():
    cfg = CausalTransformerConfig(5, 4, 6, n_copy_heads=3)
    assert CausalTransformerConfig.from_dict(cfg.to_dict()) == cfg
    assert (cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.device) == (2, 3, 20, "cpu")
    with pytest.raises(ValueError, match="unknown config fields"):
        CausalTransformerConfig.from_dict({**cfg.to_dict(), "n_ctx": 3})
    with pytest.raises(ValueError, match="n_copy_heads must be given"):
        CausalTransformerConfig(5, 0, 6)  # L = 0 (one sequence per context) needs K given
    assert CausalTransformerConfig(5, 0, 6, n_copy_heads=2).n_copy_heads == 2
    with pytest.raises(ValueError, match="non-negative integer"):
        CausalTransformerConfig(5, -1, 6, n_copy_heads=2)
    with pytest.raises(ValueError, match="positive integer"):
        CausalTransformerConfig(5, 4, 6, n_copy_heads=0)
    with pytest.raises(ValueError, match="dtype"):
        CausalTransformerConfig(5, 4, 6, dtype="int32")


@pytest.mark.parametrize(
    "tokens, match",
    [
        (torch.full((2, 20), 4), r"\[0, 4\)"),
        (torch.full((2, 20), -1), r"\[0, 4\)"),
        (torch.zeros(2, 21, dtype=torch.long), "shape"),
        (torch.zeros(20, dtype=torch.long), "shape"),
        (torch.zeros(2, 20), "integer"),
    ],
)
def test_bad_tokens_give_one_line_errors(tokens, match):
    with pytest.raises(ValueError, match=match) as e:
        random_model()(tokens)
    assert "\n" not in str(e.value)
