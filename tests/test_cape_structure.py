"""CAPE step 1: the acyclicity function, recovery on a linear-Gaussian SEM, determinism, the analysis claim."""

from __future__ import annotations

import math

import torch

from probes.cape_structure import StructureConfig, acyclicity, learn_structure, shd, skeleton_f1


def test_acyclicity_zero_on_dag_and_closed_form_on_two_cycle():
    dag = torch.tensor([[0, 0.7, -1.2], [0, 0, 0.4], [0, 0, 0]], dtype=torch.float64)
    assert abs(acyclicity(dag).item()) < 1e-12
    a, b = 0.8, 1.3
    cyc = torch.tensor([[0, a], [b, 0]], dtype=torch.float64)
    # exp([[0, a^2], [b^2, 0]]) has trace 2 cosh(ab): h = 2 cosh(ab) - 2 > 0
    assert math.isclose(acyclicity(cyc).item(), 2 * math.cosh(a * b) - 2, rel_tol=1e-10)
    assert acyclicity(cyc).item() > 0


def _linear_sem(n=1000, seed=1):
    g = torch.Generator().manual_seed(seed)
    M = 8
    W = torch.zeros(M, M, dtype=torch.float64)
    for i, j in [(0, 1), (0, 2), (1, 3), (2, 4), (3, 5), (4, 6), (1, 7)]:
        W[i, j] = (-1) ** (i + j) * (0.8 + 0.4 * torch.rand(1, generator=g).item())
    X = torch.zeros(n, M, dtype=torch.float64)
    for j in range(M):
        X[:, j] = X @ W[:, j] + torch.randn(n, generator=g, dtype=torch.float64)
    return X, W != 0


def test_linear_gaussian_sem_skeleton_recovered():
    # Measured at N=1000 on data seeds 1, 2, 3: SHD 2 and skeleton F1 0.857 each (7 true edges; the one
    # error is 7->3 in place of a true edge, siblings 3 and 7 of node 1). The empty graph scores SHD 7, F1 0.
    # SHD <= 3 and F1 >= 0.8 leave a margin of one edge.
    X, true = _linear_sem()
    A = learn_structure(X, StructureConfig())["A"]
    assert shd(A, true) <= 3
    assert skeleton_f1(A, true) >= 0.8
    assert acyclicity(A).item() < 1e-10


def test_deterministic_for_a_seed():
    X, _ = _linear_sem(n=200, seed=2)
    cfg = StructureConfig(inner_steps=50, max_outer=3, seed=5)
    assert torch.equal(learn_structure(X, cfg)["A_raw"], learn_structure(X, cfg)["A_raw"])


def test_analysis_bma_needs_fewer_samples_than_structure_learning():
    from analyses.cape_structure import compute
    from analyses.common import load_subject

    res = compute(load_subject("default"), seed=0, n_contexts=64, Ns=(20,), Ls=(10, 20), repeats=1, progress=False)
    bma = {r["L"]: r["parent_accuracy"] for r in res["bma"]}
    for kind, rows in res["structure"].items():
        # Measured (seed 0, 64 contexts): BMA at L=20 0.936; structure learning at N=20 parent accuracy
        # 0.27 (markov, SHD 54) and 0.36 (continuous, SHD 39).
        assert bma[20] > rows[0]["parent_accuracy"] + 0.1, kind
        assert rows[0]["shd"] > 5, kind
    model = {r["L"]: r for r in res["model"]}
    assert model[10]["source"].startswith("trained")
    assert abs(model[10]["parent_accuracy"] - bma[10]) < 0.05  # the trained model is BMA-like at its L
