"""Theorem 3 (analyses.init_gradient): the score gradient at W_KQ = 0 and what it implies."""

import torch

import models
from analyses.common import single_thread
from analyses.init_gradient import gradient_by_tree, init_model, score_gradients, train_from_zero
from tests.conftest import build_task


def test_autograd_matches_a_numpy_closed_form():
    """dNLL/ds = -A (v/p - 1) from the hooked model's autograd, against a NumPy computation from pi."""
    task = build_task(d_vocab=4, n_examples=3, seq_len=6)
    model = init_model(task)
    tokens, _ = task.sample(16, torch.Generator().manual_seed(0))
    grad = score_gradients(model, tokens)["autograd"].numpy()
    pi, x = task.pi.numpy(), tokens[:, -task.seq_len :].numpy()
    for b in range(16):
        for h in range(1, task.seq_len):
            v = pi[x[b, :h], x[b, h]]  # pi(x_h | x_h') for every candidate h' < h
            p = v.mean()
            expected = -(1 / h) * (v / p - 1)
            assert abs(grad[b, h, :h] - expected).max() < 1e-12
            assert (grad[b, h, h:] == 0).all()


def test_expected_parent_gradient_exceeds_every_other_on_the_shipped_task():
    task = models.load_task(models.DEFAULT_CHECKPOINT)
    res = gradient_by_tree(task, n_trees=3, n_samples=1024, seed=5)
    assert res["n_excluding_zero"] == res["n_comparisons"] > 100
    assert res["min_lower"] > 0
    assert res["max_abs_autograd_vs_closed"] < 1e-12


def test_training_w_kq_from_zero_separates_the_parent_quickly():
    task = models.load_task(models.DEFAULT_CHECKPOINT)
    with single_thread():  # many small steps: far faster on one thread
        hist = train_from_zero(task, steps=60, batch=128, lr=0.01, n_eval=256, seed=0, every=30)
    chance = hist["parent_acc"][0]
    assert chance < 0.35  # uniform attention: argmax ties broken arbitrarily
    assert hist["separation"][0] == 0 and hist["separation"][-1] > 1
    assert hist["parent_acc"][-1] > 0.85 * hist["bma_parent_acc"]
