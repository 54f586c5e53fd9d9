"""CAPE steps 2-3: the hyperboloid embedding, the Poincare map, the rotary score and the claimed properties."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from analyses import cape_properties
from cape.attention import CapeAttention, rotary_scores, rotate
from cape.embedding import (
    check_dag,
    depth,
    distance,
    embed,
    expmap,
    generality,
    hop_distance,
    hop_weights,
    initial_points,
    lift,
    minkowski_dot,
    random_dag,
    random_tree,
    riemannian_grad,
    to_poincare,
)


def _tangent(p, g):
    """A random tangent vector at p (projection of a random ambient vector)."""
    return g + minkowski_dot(p, g).unsqueeze(-1) * p


def test_expmap_stays_on_sheet_and_moves_by_the_tangent_norm():
    g = torch.Generator().manual_seed(0)
    p = lift(torch.randn(50, 3, dtype=torch.float64, generator=g))
    v = _tangent(p, torch.randn(50, 4, dtype=torch.float64, generator=g))
    assert minkowski_dot(p, v).abs().max() < 1e-10  # tangent
    q = expmap(p, v)  # no reprojection here
    assert (minkowski_dot(q, q) + 1).abs().max() < 1e-9
    assert (q[:, 0] > 0).all()
    # closed form: the geodesic from p with velocity v has length |v|_L
    torch.testing.assert_close(distance(p, q), minkowski_dot(v, v).sqrt(), rtol=1e-9, atol=1e-9)
    # the Riemannian gradient is tangent
    assert (
        minkowski_dot(p, riemannian_grad(p, torch.randn(50, 4, dtype=torch.float64, generator=g))).abs().max() < 1e-10
    )


def test_embedding_is_on_the_hyperboloid_and_the_poincare_map_is_the_ball():
    A = random_dag(10, torch.Generator().manual_seed(1))
    emb = embed(A, dim=3, steps=200)
    assert emb.losses[-1] < emb.losses[0]
    assert (minkowski_dot(emb.p, emb.p) + 1).abs().max() < 1e-10 and (emb.p[:, 0] > 0).all()
    assert (emb.e.norm(dim=-1) < 1).all()
    assert emb.phi.abs().max() < math.pi / 4
    # independent check of the Poincare map: Poincare-ball distance = hyperboloid distance
    e = emb.e
    sq = ((e[:, None] - e[None]) ** 2).sum(-1)
    n2 = (e * e).sum(-1)
    d_ball = torch.acosh((1 + 2 * sq / ((1 - n2[:, None]) * (1 - n2[None]))).clamp_min(1))
    off = ~torch.eye(10, dtype=torch.bool)  # (distance clamps arccosh at 1 + 1e-12: 1.4e-6 on the diagonal)
    torch.testing.assert_close(d_ball[off], distance(emb.p[:, None], emb.p[None])[off], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(
        to_poincare(lift(torch.zeros(1, 3, dtype=torch.float64))), torch.zeros(1, 3, dtype=torch.float64)
    )


def test_embedding_is_seeded_and_deterministic():
    A = random_tree(8, torch.Generator().manual_seed(2))
    a, b = embed(A, steps=50, seed=3), embed(A, steps=50, seed=3)
    assert torch.equal(a.p, b.p)
    assert not torch.equal(a.p, embed(A, steps=50, seed=4).p)


def _block_rotation(phi: np.ndarray) -> np.ndarray:
    n = len(phi)
    R = np.zeros((2 * n, 2 * n))
    for b, t in enumerate(phi):
        R[2 * b : 2 * b + 2, 2 * b : 2 * b + 2] = [[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]]
    return R


def test_rotary_score_is_the_relative_form_and_depends_only_on_angle_differences():
    rng = np.random.default_rng(0)
    M, n = 6, 3
    q, k = rng.standard_normal((M, 2 * n)), rng.standard_normal((M, 2 * n))
    phi = rng.uniform(-1, 1, (M, n))
    S = rotary_scores(torch.tensor(q), torch.tensor(k), torch.tensor(phi)).numpy()
    relative = np.array([[q[m] @ _block_rotation(phi[j] - phi[m]) @ k[j] for j in range(M)] for m in range(M)])
    rope = np.array(
        [[(_block_rotation(phi[m]) @ q[m]) @ (_block_rotation(phi[j]) @ k[j]) for j in range(M)] for m in range(M)]
    )
    np.testing.assert_allclose(S, relative, rtol=0, atol=1e-10)
    np.testing.assert_allclose(S, rope, rtol=0, atol=1e-10)
    shifted = rotary_scores(torch.tensor(q), torch.tensor(k), torch.tensor(phi + rng.uniform(-3, 3, n))).numpy()
    np.testing.assert_allclose(shifted, S, rtol=0, atol=1e-10)  # a common shift changes nothing
    np.testing.assert_allclose(
        rotate(torch.tensor(q[0]), torch.tensor(phi[0])).numpy(), _block_rotation(phi[0]) @ q[0], atol=1e-12
    )
    with pytest.raises(ValueError, match="expected 2"):
        rotate(torch.zeros(5), torch.zeros(2))


def test_permuting_the_features_permutes_embedding_and_attention():
    A = random_dag(7, torch.Generator().manual_seed(5))
    perm = torch.tensor([3, 0, 6, 1, 5, 2, 4])
    init = initial_points(7, 2, seed=0)
    emb = embed(A, dim=2, steps=60, init=init)
    emb_p = embed(A[perm][:, perm], dim=2, steps=60, init=init[perm])
    torch.testing.assert_close(emb_p.p, emb.p[perm], rtol=0, atol=1e-9)
    layer = CapeAttention(d_model=6, n_heads=2, d_head=4, seed=0).double()
    x = torch.randn(2, 7, 6, dtype=torch.float64)
    _, c = layer.run_with_cache(x, emb.phi)
    _, c_p = layer.run_with_cache(x[:, perm], emb_p.phi)
    torch.testing.assert_close(c_p["hook_pattern"], c["hook_pattern"][:, :, perm][:, :, :, perm], rtol=0, atol=1e-9)
    torch.testing.assert_close(layer(x[:, perm], emb_p.phi), layer(x, emb.phi)[:, perm], rtol=0, atol=1e-9)
    with pytest.raises(ValueError, match="phi must have shape"):
        layer(x, emb.phi[:, :1])


def test_graph_helpers_against_brute_force():
    # chain 0 -> 1 -> 2 -> 3 plus 0 -> 2
    A = torch.zeros(4, 4, dtype=torch.float64)
    A[0, 1], A[1, 2], A[2, 3], A[0, 2] = 0.5, -2.0, 1.0, 0.8
    np.testing.assert_array_equal(hop_distance(A)[0], [0, 1, 1, 2])
    np.testing.assert_array_equal(depth(A), [0, 1, 2, 3])
    # brute force: best |weight| product over undirected simple paths of <= 2 edges
    S = np.maximum(np.abs(A.numpy()), np.abs(A.numpy()).T)
    best = np.zeros((4, 4))
    for i, j in itertools.permutations(range(4), 2):
        best[i, j] = max([S[i, j]] + [S[i, m] * S[m, j] for m in range(4) if m not in (i, j)])
    np.testing.assert_allclose(hop_weights(A, 2).numpy(), best)
    pi = generality(A)
    assert abs(pi.sum() - 1) < 1e-12 and pi[0] > pi[1] > pi[3]  # causes outrank their effects
    with pytest.raises(ValueError, match="directed cycle"):
        check_dag(torch.tensor([[0.0, 1.0], [1.0, 0.0]]))
    with pytest.raises(ValueError, match="square"):
        check_dag(torch.zeros(2, 3))


def test_spearman_against_hand_computed_ranks():
    assert cape_properties.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1)
    # ties: ranks of y = [0.5, 0.5, 2, 3] -> Pearson with [0, 1, 2, 3]
    assert cape_properties.spearman([1, 2, 3, 4], [5, 5, 7, 9]) == pytest.approx(
        np.corrcoef([0, 1, 2, 3], [0.5, 0.5, 2, 3])[0, 1]
    )


def test_cape_properties_hold_on_small_random_graphs():
    """Measured with the default analysis (40 graphs, M=15): Spearman(score, distance) trees -0.92 (min
    -0.86), DAGs -0.53 (min -0.26); random angles ~0; Spearman(|e|, depth) +0.55; (|e|, generality) -0.71."""
    res = cape_properties.measure(n_graphs=6, nodes=10, dim=4, n_queries=64, n_perm=2, seed=0)
    s = res["summary"]
    for r in res["graphs"]:
        assert r["rho_score_distance"] < -0.2  # each graph: score decays with causal distance
    assert s["tree"]["rho_score_distance"]["mean"] < -0.6
    assert abs(s["all"]["rho_random_angles"]["mean"]) < 0.3  # the control does not
    assert s["all"]["rho_norm_depth"]["mean"] > 0.3  # specific (deep) nodes sit far from the origin
    assert s["all"]["rho_norm_generality"]["mean"] < -0.3  # general nodes near it
    assert s["all"]["perm_exact_max_err_p"]["max"] < 1e-9
    assert s["all"]["perm_exact_max_err_pattern"]["max"] < 1e-9
    assert s["all"]["rho_scores_permuted_fresh"]["min"] > 0.5


def test_cli_rejects_bad_flags(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cape_properties.main(["--nodes", "2", "--out", str(tmp_path)])
    assert e.value.code == 2
