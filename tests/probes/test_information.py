"""Exact information on trees (probes.information) against brute-force enumeration; Lemmas 2 to 4."""

import itertools

import pytest
import torch

from analyses.information import measure
from probes import MarkovTreeTask, dirichlet_kernel
from probes.information import (
    chi2_mutual_information,
    expected_log_likelihood,
    mutual_information,
    node_marginals,
    pair_joints,
    sdpi_report,
    tree_distance,
)


def brute_force_joint(pi, root, parents):
    """Enumerate all d^H sequences of the tree; return P(x_h = a, x_g = b) for every pair."""
    d, H = pi.shape[0], len(parents)
    joint = torch.zeros(H, H, d, d, dtype=torch.float64)
    for seq in itertools.product(range(d), repeat=H):
        p = root[seq[0]].item()
        for h in range(1, H):
            p *= pi[seq[parents[h]], seq[h]].item()
        for h in range(H):
            for g in range(H):
                joint[h, g, seq[h], seq[g]] += p
    return joint


def entropy(p):
    p = p[p > 0]
    return -(p * p.log()).sum()


def test_pair_joints_match_enumeration_on_a_tiny_tree():
    g = torch.Generator().manual_seed(3)
    pi = dirichlet_kernel(3, alpha=0.7, gamma=0.1, generator=g)
    root = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    parents = [-1, 0, 0, 1, 3, 2]  # a chain of depth 3 and a branch
    brute = brute_force_joint(pi, root, parents)
    exact = pair_joints(pi, root, torch.tensor(parents))
    assert torch.allclose(exact, brute, atol=1e-14)
    marginals = torch.stack([brute[h, h].diagonal() for h in range(len(parents))])
    assert torch.allclose(node_marginals(pi, root, torch.tensor(parents)), marginals, atol=1e-14)
    # MI as H(X) + H(Y) - H(X, Y) on the enumerated joint; chi-square MI from its definition.
    for h, k in [(4, 0), (4, 3), (5, 3), (2, 1)]:
        j = brute[h, k]
        mi = entropy(j.sum(1)) + entropy(j.sum(0)) - entropy(j.flatten())
        assert mutual_information(exact[h, k]).item() == pytest.approx(mi.item(), abs=1e-13)
        chi2 = sum(j[a, b] ** 2 / (j[a].sum() * j[:, b].sum()) for a in range(3) for b in range(3)) - 1
        assert chi2_mutual_information(exact[h, k]).item() == pytest.approx(chi2.item(), abs=1e-13)
    assert tree_distance(torch.tensor(parents))[4, 5].item() == 5  # 4-3-1-0-2-5


@pytest.mark.parametrize("gamma", [0.02, 0.2, 0.6])
def test_dpi_and_sdpi_bound_on_random_trees(gamma):
    """Lemma 2 on every (h, h' != pa(h)); Lemma 3: measured ratio <= Dobrushin <= 1 - delta gamma < 1."""
    for seed in range(4):
        task = MarkovTreeTask.random(4, 1, 9, alpha=0.5, gamma=gamma, seed=seed)
        for parents in task.sample_parents(10, torch.Generator().manual_seed(seed)):
            rep = sdpi_report(task.pi, task.root, parents)
            assert rep["dpi_slack"] > 0
            assert rep["bound"] < 1
            for h, r in rep["ratio"].items():
                assert r <= rep["dobrushin"][h] + 1e-12
                assert rep["dobrushin"][h] <= rep["bound"] + 1e-12


def test_lemma4_expected_log_likelihood_peaks_at_the_parent():
    task = MarkovTreeTask.random(5, 1, 10, gamma=0.2, seed=7)
    for parents in task.sample_parents(20, torch.Generator().manual_seed(1)):
        ell = expected_log_likelihood(task.pi, task.root, parents)
        assert (ell[1:].argmax(-1) == parents[1:]).all()


def test_analysis_claims_on_a_small_config():
    res = measure(n_trees=6, seq_len=7, gammas=(0.05, 0.5), kernels_per_gamma=2, seed=0)
    assert res["dpi_violations"] == 0 and res["n_pairs_checked"] > 0
    assert all(k["max_ratio"] <= k["bound"] for k in res["kernels"])
    assert res["lemma4_min_margin"] > 0
    # MI falls with tree distance on the shipped kernel (a strict contraction at every edge).
    means = [m for m in res["mi_by_distance"]["mean"] if m == m]
    assert all(a > b for a, b in zip(means, means[1:]))


def test_bad_tree_is_rejected():
    with pytest.raises(ValueError, match="parents"):
        pair_joints(torch.eye(2) * 0.5 + 0.25, torch.tensor([0.5, 0.5]), torch.tensor([-1, 1]))
