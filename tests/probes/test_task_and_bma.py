"""The task sampler and the BMA oracle against independent computations."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from probes import MarkovTreeTask, bma_posterior, bma_predictive, bma_scores, dirichlet_kernel
from tests.conftest import build_task


def brute_force_bma(pi: np.ndarray, root: np.ndarray, tokens: np.ndarray, L: int, H: int):
    """Exact Bayes by enumerating every tree: posterior over pa(h) given the demonstrations, and the
    predictive of x_h^{L+1} given the demonstrations AND the target prefix x_{<h}^{L+1}."""
    x = tokens.reshape(L + 1, H)
    trees = list(itertools.product(*[range(h) for h in range(1, H)]))  # parents of h = 1..H-1
    post = np.zeros((H, H))
    pred = np.zeros((H, pi.shape[0]))
    pred[0] = root
    for h in range(1, H):
        weights_demo, weights_pred = [], []
        for tree in trees:
            pa = (-1,) + tree
            lik = [root[x[l, 0]] * np.prod([pi[x[l, pa[j]], x[l, j]] for j in range(1, H)]) for l in range(L)]
            weights_demo.append(np.prod(lik))
            prefix = root[x[L, 0]] * np.prod([pi[x[L, pa[j]], x[L, j]] for j in range(1, h)])
            weights_pred.append(np.prod(lik) * prefix)
        weights_demo = np.array(weights_demo) / sum(weights_demo)
        weights_pred = np.array(weights_pred) / sum(weights_pred)
        for tree, w, wp in zip(trees, weights_demo, weights_pred):
            post[h, tree[h - 1]] += w
            pred[h] += wp * pi[x[L, tree[h - 1]]]
    return post, pred


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bma_matches_brute_force_enumeration_of_trees(seed):
    task = build_task(d_vocab=3, n_examples=3, seq_len=5, seed=seed)
    tokens, _ = task.sample(4, torch.Generator().manual_seed(seed))
    post = bma_posterior(task.pi, tokens, 3, 5)
    pred = bma_predictive(task.pi, tokens, 3, 5, task.root)
    for b in range(len(tokens)):
        want_post, want_pred = brute_force_bma(task.pi.numpy(), task.root.numpy(), tokens[b].numpy(), 3, 5)
        np.testing.assert_allclose(post[b].numpy(), want_post, atol=1e-12)
        np.testing.assert_allclose(pred[b].numpy(), want_pred, atol=1e-12)


def test_bma_is_float64_and_rows_are_distributions(small_task):
    tokens, _ = small_task.sample(16)
    post = bma_posterior(small_task.pi, tokens, small_task.n_examples, small_task.seq_len)
    pred = bma_predictive(small_task.pi, tokens, small_task.n_examples, small_task.seq_len)
    assert post.dtype == pred.dtype == torch.float64
    assert torch.all(post[:, 0] == 0)
    torch.testing.assert_close(post[:, 1:].sum(-1), torch.ones(16, small_task.seq_len - 1, dtype=torch.float64))
    assert torch.all(post.triu() == 0), "mass on a candidate h' >= h"
    torch.testing.assert_close(pred.sum(-1), torch.ones(16, small_task.seq_len, dtype=torch.float64))


def test_zeros_in_pi_give_minus_inf_scores_never_nan():
    pi = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.5, 0.5], [0.5, 0.0, 0.5]], dtype=torch.float64)
    task = MarkovTreeTask(pi, n_examples=4, seq_len=6)
    tokens, _ = task.sample(64, torch.Generator().manual_seed(0))
    scores = bma_scores(pi, tokens, 4, 6)
    assert torch.isneginf(scores[:, 1:].tril(-1)).any(), "expected some impossible parents"
    assert not scores.isnan().any()
    post = bma_posterior(pi, tokens, 4, 6)
    pred = bma_predictive(pi, tokens, 4, 6, log=True)
    assert not post.isnan().any() and not pred.isnan().any()
    torch.testing.assert_close(post[:, 1:].sum(-1), torch.ones(64, 5, dtype=torch.float64))
    # The true tree always has positive likelihood, so its posterior is never 0 ... unless pi forbids it.


def test_impossible_data_gives_zero_rows_not_nan():
    pi = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    tokens = torch.tensor([[0, 1, 0, 1]])  # L=1, H=2: x_1 = 1 after x_0 = 0 is impossible under pi
    post = bma_posterior(pi, tokens, 1, 2)
    assert torch.all(post == 0) and not post.isnan().any()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), L=st.integers(1, 5), H=st.integers(2, 6), d=st.integers(2, 5))
def test_posterior_is_invariant_to_the_order_of_demonstrations(seed, L, H, d):
    task = MarkovTreeTask.random(d, L, H, seed=seed)
    g = torch.Generator().manual_seed(seed)
    tokens, _ = task.sample(3, g)
    perm = torch.randperm(L, generator=g)
    blocks = tokens.view(3, L + 1, H)
    permuted = torch.cat([blocks[:, perm], blocks[:, L:]], 1).reshape(3, -1)
    torch.testing.assert_close(bma_posterior(task.pi, tokens, L, H), bma_posterior(task.pi, permuted, L, H))


def test_dropping_demonstrations_equals_bma_on_fewer_demonstrations(small_task):
    L, H = small_task.n_examples, small_task.seq_len
    tokens, _ = small_task.sample(8)
    keep = [0, 2]
    fewer = tokens.view(8, L + 1, H)[:, keep + [L]].reshape(8, -1)
    torch.testing.assert_close(
        bma_posterior(small_task.pi, tokens, L, H, demonstrations=keep), bma_posterior(small_task.pi, fewer, 2, H)
    )


def test_sampler_layout_parents_and_transition_frequencies():
    task = build_task(d_vocab=3, n_examples=2, seq_len=4, seed=3)
    tokens, parents = task.sample(20_000, torch.Generator().manual_seed(1))
    assert tokens.shape == (20_000, 12) and parents.shape == (20_000, 4)
    assert torch.all(parents[:, 0] == -1)
    h = torch.arange(1, 4)
    assert torch.all((parents[:, 1:] >= 0) & (parents[:, 1:] < h))
    x = tokens.view(-1, 3, 4)  # [b, l, h]
    # Every sequence of a context follows the SAME tree: empirical pi(b | a) from (x_pa(h), x_h) pairs.
    counts = np.zeros((3, 3))
    for hh in range(1, 4):
        par = x.gather(2, parents[:, hh].view(-1, 1, 1).expand(-1, 3, 1)).squeeze(2)
        np.add.at(counts, (par.flatten().numpy(), x[:, :, hh].flatten().numpy()), 1)
    freq = counts / counts.sum(1, keepdims=True)
    se = np.sqrt(task.pi.numpy() * (1 - task.pi.numpy()) / counts.sum(1, keepdims=True))
    assert np.all(np.abs(freq - task.pi.numpy()) < 5 * se + 1e-9)
    root_freq = np.bincount(x[:, :, 0].flatten().numpy(), minlength=3) / x[:, :, 0].numel()
    np.testing.assert_allclose(root_freq, task.root.numpy(), atol=0.01)
    # Parent choices are uniform over {0..h-1}.
    np.testing.assert_allclose(np.bincount(parents[:, 3].numpy(), minlength=3) / 20_000, [1 / 3] * 3, atol=0.015)


def test_sampling_is_a_function_of_the_seed(small_task):
    a = small_task.sample(8, torch.Generator().manual_seed(5))
    b = small_task.sample(8, torch.Generator().manual_seed(5))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_dirichlet_kernel_is_minorised_and_seeded():
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    pi = dirichlet_kernel(6, alpha=0.5, gamma=0.3, generator=g1)
    assert torch.equal(pi, dirichlet_kernel(6, alpha=0.5, gamma=0.3, generator=g2))
    torch.testing.assert_close(pi.sum(-1), torch.ones(6, dtype=torch.float64))
    assert pi.min() >= 0.3 / 6 - 1e-15


@pytest.mark.parametrize(
    "pi, match",
    [
        ([[0.5, 0.6], [0.5, 0.5]], "not row-stochastic"),
        ([[1.5, -0.5], [0.5, 0.5]], "negative"),
        ([[0.5, 0.5]], "square"),
        ([[float("nan"), 1.0], [0.5, 0.5]], "NaN"),
    ],
)
def test_bad_kernels_are_rejected(pi, match):
    with pytest.raises(ValueError, match=match):
        MarkovTreeTask(torch.tensor(pi), 2, 3)


@pytest.mark.parametrize(
    "tokens, match",
    [
        (torch.full((2, 20), 7), r"\[0, 4\)"),
        (torch.zeros(2, 19, dtype=torch.long), "shape"),
        (torch.zeros(2, 20), "integer"),
    ],
)
def test_bad_tokens_are_rejected(small_task, tokens, match):
    with pytest.raises(ValueError, match=match):
        bma_posterior(small_task.pi, tokens, small_task.n_examples, small_task.seq_len)
