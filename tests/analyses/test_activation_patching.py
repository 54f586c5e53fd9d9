"""analyses.activation_patching: the normalisation's fixed points (all heads = 1, nothing = 0, own cache
= 1), the identities between the sweeps, and a closed form for the Theorem 1 model (patching head k is
BMA on the corrupted context with demonstration l(k) put back)."""

from __future__ import annotations

import json

import pytest
import torch
from transformer_lens.patching import layer_pos_head_vector_patch_setter

import models
from analyses import activation_patching as ap
from analyses.common import single_thread
from models import DisentangledSubject, load_subject
from models.interp.interventions import corrupted_contexts
from models.interp.patching import index_df
from probes import bma_posterior, bma_predictive
from tests.conftest import build_task

L, H, N = 3, 6, 96
PERM = [1, 2, 0]  # head k copies demonstration PERM[k]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Hundreds of small forward passes: one intra-op thread is faster (and fair to a shared machine)."""
    with single_thread():
        yield


@pytest.fixture(scope="module")
def theorem1_run():
    task = build_task(d_vocab=4, n_examples=L, seq_len=H, seed=2)
    model = models.theorem1_model(task.pi, L, H, 50.0)
    with torch.no_grad():
        w_L = model.blocks[0].attn.w_L
        w_L[:, :L] = w_L[PERM, :L].clone()
    g = torch.Generator().manual_seed(7)
    tokens, parents = task.sample(N, g)
    state = g.get_state()
    r = ap.activation_patching(DisentangledSubject(model, task, "test", ""), tokens, parents, g)
    g.set_state(state)
    corrupted, _ = corrupted_contexts(task, tokens, g)  # the same corrupted contexts
    return task, model, tokens, parents, corrupted, r, state


@pytest.fixture(scope="module")
def checkpoint_patcher():
    subject = load_subject("default")
    g = torch.Generator().manual_seed(0)
    tokens, parents = subject.task.sample(64, g)
    corrupted, _ = corrupted_contexts(subject.task, tokens, g)
    return ap.Patcher(subject.model.eval(), tokens, corrupted, parents), tokens, subject.model.cfg


def test_corrupted_contexts_share_the_target_and_change_the_demonstrations():
    task = build_task(n_examples=L, seq_len=H)
    tokens, _ = task.sample(50, torch.Generator().manual_seed(0))
    corrupted, _ = corrupted_contexts(task, tokens, torch.Generator().manual_seed(1))
    assert torch.equal(corrupted[:, -H:], tokens[:, -H:])
    assert (corrupted[:, :-H] != tokens[:, :-H]).any(1).all()


def test_shipped_checkpoint_all_heads_restore_clean_and_nothing_gives_zero(checkpoint_patcher):
    p, _, _ = checkpoint_patcher
    one = ap.pd.DataFrame({"layer": [0]})
    torch.testing.assert_close(
        p.sweep("z", ap.patch_everything, one), torch.ones(2, 1, dtype=torch.float64), atol=1e-6, rtol=0
    )
    assert torch.equal(p.sweep("z", ap.patch_nothing, one), torch.zeros(2, 1, dtype=torch.float64))
    assert (p.denominator > 0).all()  # clean is better than corrupted on both metrics


def test_patching_the_clean_run_with_its_own_cache_gives_one_in_every_cell(checkpoint_patcher):
    p, tokens, cfg = checkpoint_patcher
    cells = index_df(0, ("pos", cfg.seq_len), ("head_index", cfg.n_heads))
    values = p.sweep("z", layer_pos_head_vector_patch_setter, cells, tokens=tokens)
    torch.testing.assert_close(values, torch.ones_like(values), atol=1e-6, rtol=0)


def test_sweeps_agree_where_they_patch_the_same_numbers(theorem1_run):
    r = theorem1_run[5]
    # residual subspace k+1 is head k's copy; subspace 0 (the shared target token) changes nothing
    assert torch.equal(r["subspaces_by_position"][:, 1:], r["heads_by_position"])
    assert torch.equal(r["subspaces_all_positions"][:, 1:], r["heads_all_positions"])
    for key in ("subspaces_by_position", "query_by_position", "key_by_position"):
        assert torch.equal(r[key][:, 0], torch.zeros_like(r[key][:, 0])), key
    torch.testing.assert_close(r["all_heads"], torch.ones(2, dtype=torch.float64), atol=1e-6, rtol=0)
    assert torch.equal(r["nothing"], torch.zeros(2, dtype=torch.float64))
    # The query at p = 0 has no candidates, the key at p = H-1 is nobody's candidate.
    assert torch.equal(r["query_by_position"][..., 0], torch.zeros_like(r["query_by_position"][..., 0]))
    assert torch.equal(r["key_by_position"][..., -1], torch.zeros_like(r["key_by_position"][..., -1]))
    # Theorem 1 reads values from the token only: query + key restore the clean run exactly.
    torch.testing.assert_close(r["query_and_key_all"], torch.ones(2, dtype=torch.float64), atol=1e-6, rtol=0)


def _bma_metrics(task, tokens, clean_tokens, parents):
    """The two metrics of the BMA oracle on ``tokens``: per-context means over h >= 2."""
    pred = bma_predictive(task.pi, tokens, L, H, task.root, log=True)
    logprob = pred.gather(-1, clean_tokens[:, -H:, None])[:, 2:, 0].mean(1)
    post = bma_posterior(task.pi, tokens, L, H)
    mass = post.gather(-1, parents.clamp_min(0)[..., None])[:, 2:, 0].mean(1)
    return torch.stack([logprob.mean(), mass.mean()])


def test_theorem1_patching_head_k_is_bma_with_its_demonstration_restored(theorem1_run):
    task, _, tokens, parents, corrupted, r, _ = theorem1_run
    clean = _bma_metrics(task, tokens, tokens, parents)
    base = _bma_metrics(task, corrupted, tokens, parents)
    T = H  # tokens per example
    for k, demo in enumerate(PERM):
        hybrid = corrupted.clone()
        hybrid[:, demo * T : (demo + 1) * T] = tokens[:, demo * T : (demo + 1) * T]
        expected = (_bma_metrics(task, hybrid, tokens, parents) - base) / (clean - base)
        torch.testing.assert_close(r["heads_all_positions"][:, k], expected, atol=1e-5, rtol=0)
    assert r["demonstrations"] == PERM


def test_equal_clean_and_corrupted_runs_are_refused():
    task = build_task(n_examples=L, seq_len=H)
    model = models.theorem1_model(task.pi, L, H, 50.0)
    tokens, parents = task.sample(8)
    with pytest.raises(ValueError, match="same mean"):
        ap.Patcher(model, tokens, tokens.clone(), parents)
    with pytest.raises(ValueError, match="eval"):
        ap.Patcher(model.train(), tokens, tokens.clone(), parents)


def test_cli_writes_heatmaps_and_json(tmp_path, capsys):
    ap.main(["--checkpoint", "theorem1:beta=50", "--n-contexts", "24", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "activation_patching.json").read_text())["results"]
    assert results["all_heads"] == pytest.approx([1, 1], abs=1e-6) and results["nothing"] == [0, 0]
    for name in ("heads", "subspaces", "qk"):
        assert (tmp_path / f"activation_patching_{name}.png").stat().st_size > 0
    assert "all heads 1.000000" in capsys.readouterr().out


def test_same_seed_same_numbers(theorem1_run):
    task, model, tokens, parents, _, r, state = theorem1_run
    subject = DisentangledSubject(model, task, "test", "")
    again = ap.activation_patching(subject, tokens, parents, torch.Generator().set_state(state))
    for key in ("heads_by_position", "subspaces_by_position", "query_by_position", "key_by_position"):
        assert torch.equal(again[key], r[key]), key
