"""models.interp.patching: each ready sweep against a hand loop of ``run_with_hooks`` with hooks written here."""

from __future__ import annotations

import pytest
import torch
from transformer_lens.patching import layer_pos_head_vector_patch_setter

from models import CausalTransformer, CausalTransformerConfig
from models.interp.patching import (
    generic_activation_patch,
    index_df,
    patch_copyer_heads,
    patch_layer2_pattern,
    patch_subspaces,
)
from tests.conftest import build_task


@pytest.fixture(scope="module")
def setup():
    """A random model (K = 2 heads for L = 3 demonstrations, so the head and demonstration axes differ),
    clean and corrupted contexts, the clean cache and a scalar metric."""
    task = build_task(d_vocab=4, n_examples=3, seq_len=5)
    model = CausalTransformer(CausalTransformerConfig(4, 3, 5, n_copy_heads=2, dtype="float64"))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    model.eval()
    clean, _ = task.sample(6, torch.Generator().manual_seed(2))
    corrupted, _ = task.sample(6, torch.Generator().manual_seed(3))
    target = clean[:, -task.seq_len :, None]

    def metric(log_probs):
        return log_probs.gather(-1, target)[:, 1:].mean()

    with torch.no_grad():
        _, cache = model.run_with_cache(clean)
    return model, clean, corrupted, cache, metric


def hand(model, corrupted, metric, name, write) -> float:
    """The metric of one patched run: the hook clones the activation and ``write``s into the clone."""

    def hook(act, hook):
        act = act.clone()
        write(act)
        return act

    with torch.no_grad():
        return metric(model.run_with_hooks(corrupted, fwd_hooks=[(name, hook)])).item()


def test_copyer_heads_by_position_and_at_every_position(setup):
    model, _, corrupted, cache, metric = setup
    K, H = model.cfg.n_copy_heads, model.cfg.seq_len
    clean_z = cache["blocks.0.attn.hook_z"]
    got = patch_copyer_heads(model, corrupted, cache, metric)
    assert got.shape == (H, K)
    for h in range(H):
        for k in range(K):

            def write(act, h=h, k=k):
                act[:, h, k] = clean_z[:, h, k]

            assert got[h, k].item() == pytest.approx(
                hand(model, corrupted, metric, "blocks.0.attn.hook_z", write), abs=1e-6
            )
    every = patch_copyer_heads(model, corrupted, cache, metric, by_position=False)
    for k in range(K):

        def write_all(act, k=k):
            act[:, :, k] = clean_z[:, :, k]

        assert every[k].item() == pytest.approx(
            hand(model, corrupted, metric, "blocks.0.attn.hook_z", write_all), abs=1e-6
        )
    # the patches must matter, or the comparison proves little
    unpatched = metric(model(corrupted)).item()
    assert (got - unpatched).abs().max() > 1e-3


@pytest.mark.parametrize(
    "side, name",
    [("query", "blocks.1.attn.hook_q"), ("key", "blocks.1.attn.hook_k"), ("residual", "blocks.0.hook_resid_post")],
)
def test_subspaces_on_each_side(setup, side, name):
    model, _, corrupted, cache, metric = setup
    K, H, d = model.cfg.n_copy_heads, model.cfg.seq_len, model.cfg.d_vocab
    clean = cache[name]
    got = patch_subspaces(model, corrupted, cache, metric, side=side)
    every = patch_subspaces(model, corrupted, cache, metric, side=side, by_position=False)
    assert got.shape == (K + 1, H) and every.shape == (K + 1,)
    for s in range(K + 1):
        cols = slice(s * d, (s + 1) * d)
        for h in range(H):

            def write(act, h=h, cols=cols):
                act[:, h, ..., cols] = clean[:, h, ..., cols]

            assert got[s, h].item() == pytest.approx(hand(model, corrupted, metric, name, write), abs=1e-6)

        def write_all(act, cols=cols):
            act[..., cols] = clean[..., cols]

        assert every[s].item() == pytest.approx(hand(model, corrupted, metric, name, write_all), abs=1e-6)
    unpatched = metric(model(corrupted)).item()
    if side == "query":  # the query's token subspace is zeroed: patching it changes nothing
        assert (got[0] - unpatched).abs().max() < 1e-12
    assert (got[1:] - unpatched).abs().max() > 1e-3


def test_layer2_pattern_per_query_position(setup):
    model, _, corrupted, cache, metric = setup
    H = model.cfg.seq_len
    clean = cache["blocks.1.attn.hook_pattern"]
    got = patch_layer2_pattern(model, corrupted, cache, metric)
    assert got.shape == (H,)
    for h in range(H):

        def write(act, h=h):
            act[:, 0, h] = clean[:, 0, h]

        assert got[h].item() == pytest.approx(
            hand(model, corrupted, metric, "blocks.1.attn.hook_pattern", write), abs=1e-6
        )


def test_per_example_results_and_a_sweep_past_the_layer_are_refused_before_running(setup):
    model, _, corrupted, cache, metric = setup
    K, H = model.cfg.n_copy_heads, model.cfg.seq_len
    per_example = patch_copyer_heads(
        model, corrupted, cache, lambda lp: metric(lp).expand(len(lp)), by_position=False, reduce="none"
    )
    assert per_example.values.shape == (K, len(corrupted)) and list(per_example.index_df.columns) == [
        "layer",
        "head_index",
    ]
    # an explicit index_df that gives blocks.1 the K heads of blocks.0: one line, before any forward pass
    runs = []
    model.hook_log_probs.add_hook(lambda act, hook: runs.append(1))
    try:
        with pytest.raises(ValueError) as e:
            generic_activation_patch(
                model,
                corrupted,
                cache,
                metric,
                layer_pos_head_vector_patch_setter,
                "z",
                index_df=index_df(1, ("pos", H), ("head_index", K)),
            )
    finally:
        model.reset_hooks()
    assert "\n" not in str(e.value) and "models.interp.patching" in str(e.value) and "head_index=1" in str(e.value)
    assert runs == []
    with pytest.raises(ValueError, match="side must be one of"):
        patch_subspaces(model, corrupted, cache, metric, side="value")
