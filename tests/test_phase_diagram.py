"""analyses.phase_diagram: the sweep on a tiny grid runs for every family, its progress is the hand
computation from NLLs recomputed here (BMA and the plateau by brute force), boundary cells get seeds."""

from __future__ import annotations

import numpy as np
import torch

from analyses import phase_diagram
from analyses.phase_diagram import Grid, compute, plot, plot_curves, steps_to
from models.standard import StandardConfig


def _brute_force_nlls(task, tokens) -> tuple[float, float]:
    """NLL (h >= 1) of BMA and of the uniform-parent plateau, looping over contexts and parents."""
    pi, L, H = task.pi.numpy(), task.n_examples, task.seq_len
    x = tokens.numpy().reshape(len(tokens), L + 1, H)
    bma, flat = [], []
    for b in range(len(x)):
        for h in range(1, H):
            like = np.array([np.prod([pi[x[b, l, j], x[b, l, h]] for l in range(L)]) for j in range(h)])
            cand = np.array([pi[x[b, L, j], x[b, L, h]] for j in range(h)])
            bma.append(-np.log(like @ cand / like.sum()))
            flat.append(-np.log(cand.mean()))
    return float(np.mean(bma)), float(np.mean(flat))


def test_tiny_sweep_progress_matches_a_hand_computation(tmp_path):
    grid = Grid(
        kernels=[(0.3, 0.05)],
        rows=[(2, "target")],
        steps=4,
        disentangled_steps=4,
        eval_every=2,
        eval_contexts=24,
        seq_len=4,
        boundary=10.0,  # every cell is "near the boundary": the extra seeds run
        extra_seeds=1,
        max_boundary_cells=1,
        d_model=8,
        n_heads=2,
        d_mlp=8,
        batch_size=8,
    )
    res = compute(grid, log=lambda s: None)
    cells = res["cells"]
    assert [c["family"] for c in cells] == ["gpt2", "attn_only", "disentangled"]
    task = StandardConfig(d_vocab=5, n_examples=2, seq_len=4, alpha=0.3, gamma=0.05, task_seed=grid.task_seed).task()
    for c in cells:
        for r in c["runs"]:
            tokens, _ = task.sample(24, torch.Generator().manual_seed(r["seed"] + 1_000_003))
            nll_bma, nll_flat = _brute_force_nlls(task, tokens)
            assert abs(r["nll_bma"] - nll_bma) < 1e-9 and abs(r["nll_uniform"] - nll_flat) < 1e-9
            want = [(nll_flat - n) / (nll_flat - nll_bma) for n in r["nll"]]
            assert np.allclose(r["progress"], want, rtol=0, atol=1e-12)
            assert r["steps"] == [0, 2, 4]
        assert c["final_progress"] == [r["progress"][-1] for r in c["runs"]]
        assert c["mean_progress"] == np.mean(c["final_progress"])
    assert [c["seeds"] for c in cells] == [[0, 1]] * 3  # every cell is a boundary cell here
    plot(res)
    plot_curves(res)


def test_steps_to_half_is_the_first_evaluation_at_or_above_it():
    run = {"steps": [0, 100, 200, 300], "progress": [-0.1, 0.49, 0.5, 0.9]}
    assert steps_to(run) == 200 and steps_to(run, 0.95) is None


def test_bad_grid_is_one_line_error():
    import pytest

    with pytest.raises(ValueError, match="families must be among"):
        Grid(families=["lstm"])
    with pytest.raises(ValueError, match="rows must be"):
        Grid(rows=[(6, "some")])
    assert phase_diagram.QUICK.steps < Grid().steps
