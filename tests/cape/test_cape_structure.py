"""CAPE step 1: the acyclicity function, recovery on a linear-Gaussian SEM, determinism, the analysis claim."""

from __future__ import annotations

import math

import pytest
import torch

from cape.structure import StructureConfig, acyclicity, learn_structure, shd, skeleton_f1


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
    from analyses.cape_structure import measure
    from models import load_subject

    res = measure(
        load_subject("default"),
        seed=0,
        n_contexts=64,
        Ns=(20,),
        Ls=(10, 20),
        n_trees=1,
        encoders=("linear",),
        progress=False,
    )
    for kind in ("markov", "continuous"):
        bma = {r["L"]: r["parent_accuracy"] for r in res["bma"][kind]}
        row = res["structure"][f"{kind}/linear"][0]
        # Measured (seed 0, 64 contexts): BMA at L=20 0.94 (markov) and 1.00 (continuous); structure learning
        # at N=20 parent accuracy 0.27 (markov, SHD 54) and 0.36 (continuous, SHD 39).
        assert bma[20] > row["parent_accuracy"] + 0.1, kind
        assert row["shd"] > 5, kind
    model = {r["L"]: r for r in res["model"]}
    assert model[10]["source"].startswith("trained")
    bma = {r["L"]: r["parent_accuracy"] for r in res["bma"]["markov"]}
    assert abs(model[10]["parent_accuracy"] - bma[10]) < 0.05  # the trained model is BMA-like at its L


def test_mlp_f_without_extra_features_is_the_linear_model():
    g = torch.Generator().manual_seed(3)
    X = torch.randn(100, 5, 2, dtype=torch.float64, generator=g)
    X[:, 1] += 0.8 * X[:, 0]
    cfg = dict(inner_steps=20, max_outer=3, seed=1)
    linear = learn_structure(X, StructureConfig(**cfg))
    mlp0 = learn_structure(X, StructureConfig(f="mlp", extra=0, **cfg))
    torch.testing.assert_close(mlp0["A_raw"], linear["A_raw"], rtol=0, atol=0)


def test_quadratic_edges_are_invisible_to_the_linear_f_and_found_by_the_mlp_f():
    # x_j = rho * std(x_pa^2) + noise: for a Gaussian parent (the root) the child is exactly uncorrelated with
    # it, so a linear SEM cannot see the edge; the MLP f, whose learned feature m_i(x_i) can approximate x_i^2,
    # can. Measured at H = 10, N = 500, data seed 7 on trees 0..3: skeleton F1 linear 0.80 / 0.75 / 0.67 / 0.71,
    # mlp 0.94 each; data seed 8: linear mean 0.57, mlp 0.84. Asserted on trees 0 and 2 (linear mean 0.73, mlp
    # 0.94): mlp mean >= 0.85 and a margin of 0.1 (half the measured one).
    from cape.structure import nonlinear_tree_data, structure_metrics
    from probes.tasks import MarkovTreeTask

    task = MarkovTreeTask.random(5, 10, 10, 1.0, 0.2, 0)
    f1 = {"linear": [], "mlp": []}
    for tree in (0, 2):
        parents = task.sample_parents(1, torch.Generator().manual_seed(tree))[0]
        X = nonlinear_tree_data(parents, 500, seed=7)
        for f in f1:
            f1[f].append(structure_metrics(learn_structure(X, StructureConfig(f=f))["A"], parents)["skeleton_f1"])
    mean = {f: sum(v) / len(v) for f, v in f1.items()}
    assert mean["mlp"] >= 0.85, f1
    assert mean["mlp"] > mean["linear"] + 0.1, f1


def test_a_squared_gaussian_parent_is_uncorrelated_with_its_child():
    from cape.structure import nonlinear_tree_data

    X = nonlinear_tree_data(torch.tensor([-1, 0, 0]), 20000, seed=0, quadratic=1.0)[..., 0]
    corr = torch.corrcoef(X.T)
    assert corr[0, 1].abs() < 4 / 20000**0.5 and corr[0, 2].abs() < 4 / 20000**0.5  # E[x (x^2 - 1)] = 0
    assert corr[1, 2] > 0.5  # the two children share x_0^2: rho^2 = 0.64 in closed form
    assert abs(corr[1, 2].item() - 0.64) < 4 / 20000**0.5 * 2


def test_model_parent_pick_matches_hugging_face_attentions_and_the_disentangled_layer_2(tmp_path):
    """The parent pick of a GPT-2 (a Hugging Face folder) against its own ``output_attentions``: per head,
    the attention of the row predicting x_h on the keys holding x_h' (h' < h); the head with the most mass
    on the true parent and its argmax accuracy, by loops. On the disentangled model: blocks.1's pattern."""
    import sys
    from pathlib import Path

    from transformers import GPT2LMHeadModel

    import models
    from analyses.cape_structure import model_parent_accuracy

    sys.path.insert(0, str(Path(__file__).parent))
    from test_formats import hf_folder

    folder, _, task = hf_folder(tmp_path)
    hf = GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()  # returns its attentions
    L, H = task.n_examples, task.seq_len
    tokens, parents = task.sample(12, torch.Generator().manual_seed(4))
    layout = models.load_layout(folder)
    with torch.no_grad():
        attentions = hf(layout.encode(tokens), output_attentions=True).attentions
    pos, pred = layout.token_positions()[L].tolist(), layout.prediction_positions().tolist()
    best = None
    for layer, att in enumerate(attentions):
        for head in range(att.shape[1]):
            mass, hits = [], []
            for b in range(len(tokens)):
                for h in range(1, H):
                    row = [att[b, head, pred[h], pos[g]].item() for g in range(h)]
                    mass.append(row[parents[b, h].item()])
                    hits.append(max(range(h), key=row.__getitem__) == parents[b, h].item())
            if best is None or sum(mass) / len(mass) > best[0]:
                best = (sum(mass) / len(mass), sum(hits) / len(hits), f"L{layer}H{head}")
    accuracy, head = model_parent_accuracy(models.load_subject(folder), tokens, parents)
    assert head == best[2]
    assert accuracy == pytest.approx(best[1], abs=1e-12)

    subject = models.load_subject("default")
    tokens, parents = subject.task.sample(64, torch.Generator().manual_seed(5))
    with torch.no_grad():
        _, cache = subject.model.run_with_cache(tokens)
    pattern = cache["blocks.1.attn.hook_pattern"][:, 0]
    expected = (pattern[:, 1:].argmax(-1) == parents[:, 1:]).double().mean().item()
    assert model_parent_accuracy(subject, tokens, parents) == (pytest.approx(expected, abs=1e-12), "L1H0")
