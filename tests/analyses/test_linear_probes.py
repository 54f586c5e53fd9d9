"""probes.linear and analyses.linear_probes: held-out accuracy against the shuffled-label control."""

from __future__ import annotations

import pytest
import torch
from conftest import build_task
from test_formats import hf_folder

import models
from analyses.linear_probes import copyer_probes, parent_probes, standard_probes
from models.interp.subject import load_subject
from probes.linear import linear_probe


def test_probe_decodes_a_linear_code_and_the_control_does_not():
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 4, (800,), generator=g)
    features = torch.nn.functional.one_hot(labels, 4).double() @ torch.randn(4, 6, generator=g, dtype=torch.float64)
    features = features + 0.1 * torch.randn(800, 6, generator=g, dtype=torch.float64)
    r = linear_probe(features, labels, 4, seed=0)
    assert r.test_acc == 1.0 and r.n_test == 200
    assert r.control_acc < 0.4 and r.majority_acc < 0.4  # 4 balanced classes: chance 0.25


def test_probe_rejects_bad_labels():
    with pytest.raises(ValueError, match="labels must lie"):
        linear_probe(torch.zeros(10, 2), torch.full((10,), 5), 3)


def test_theorem1_copyer_k_holds_demonstration_k_and_nothing_else():
    task = build_task(d_vocab=4, n_examples=3, seq_len=5, alpha=0.5)
    model = models.theorem1_model(task.pi, 3, 5, beta=50)
    r = copyer_probes(model, task, n_contexts=200, seed=0)
    acc = torch.tensor(r["test_acc"])
    assert torch.equal(acc.diagonal(), torch.ones(3))  # beta = 50: exact copies of x_h^k
    off = acc[~torch.eye(3, dtype=torch.bool)]
    assert off.max() < 0.8 and torch.tensor(r["control_acc"]).max() < 0.6


def test_parent_probe_has_one_probe_per_position():
    task = build_task(d_vocab=4, n_examples=3, seq_len=5)
    model = models.theorem1_model(task.pi, 3, 5, beta=50)
    r = parent_probes(model, task, n_contexts=200, seed=0)
    assert r["h"] == [1, 2, 3, 4] and r["chance"] == [1, 1 / 2, 1 / 3, 1 / 4]
    assert r["probe"][0]["test_acc"] == 1.0  # pa(1) = 0 always


def test_standard_probes_shapes_and_embedding_knows_no_demonstration_token(tmp_path):
    task = build_task(d_vocab=4, n_examples=3, seq_len=5)
    folder, _, _ = hf_folder(tmp_path, task)
    r = standard_probes(load_subject(folder), n_contexts=300, seed=0)
    assert r["layers"] == ["embed", "after block 0", "after block 1"]
    acc = torch.tensor(r["test_acc"])
    assert acc.shape == (3, 3)
    # The embedding at L*H + h - 1 holds x_{h-1} of the TARGET and a position: x_h^l is not in it beyond
    # what the tree correlates; no probe can beat the best label-only guess by much.
    assert (acc[0] <= torch.tensor(r["majority_acc"][0]) + 0.25).all()
