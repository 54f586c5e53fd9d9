"""Copyer heads: assignment and purity against a NumPy recomputation of the pattern from w^H, w^L;
the duplicate flag on a constructed model where two heads copy the same demonstration."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import build_task

import models
from analyses import copyers


def _np_pattern(w_H: np.ndarray, w_L: np.ndarray, L: int, H: int) -> np.ndarray:
    """[K, H, (L+1)H] copyer pattern from the paper's formula, target keys h' >= h masked."""
    K = w_H.shape[0]
    s = np.full((K, H, L + 1, H), -np.inf)
    for k in range(K):
        for h in range(H):
            for l in range(L + 1):
                for hp in range(H):
                    if l < L or hp < h:
                        s[k, h, l, hp] = w_H[k, hp - h + H - 1] + w_L[k, l]
    s = s.reshape(K, H, -1)
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_assignment_and_purity_match_numpy_on_random_copyers():
    L, H = 3, 4
    model = models.CausalTransformer(models.CausalTransformerConfig(3, L, H, dtype="float64"))
    with torch.no_grad():
        model.blocks[0].attn.w_H.normal_(0, 1.0)
        model.blocks[0].attn.w_L.normal_(0, 2.0)
    p = _np_pattern(model.blocks[0].attn.w_H.detach().numpy(), model.blocks[0].attn.w_L.detach().numpy(), L, H).reshape(
        L, H, L + 1, H
    )
    mass = p.sum(-1).mean(1)  # [K, L+1]
    same = np.stack([[p[k, np.arange(H), l, np.arange(H)].mean() for l in range(L + 1)] for k in range(L)])
    res = copyers.copyer_report(model)
    np.testing.assert_allclose(res["demonstration_mass"].numpy(), mass, atol=1e-12)
    np.testing.assert_allclose(res["copy_mass"].numpy(), same, atol=1e-12)
    assert res["head_demo"] == mass[:, :L].argmax(1).tolist()
    assert res["purity"] == pytest.approx(mass[:, :L].max(1).tolist(), abs=1e-12)


def test_theorem1_heads_are_pure_and_distinct():
    task = build_task(d_vocab=4, n_examples=3, seq_len=5)
    res = copyers.copyer_report(models.theorem1_model(task.pi, 3, 5, beta=50.0))
    assert res["head_demo"] == [0, 1, 2] and res["duplicates"] == {} and copyers.duplicate_warning(res) is None
    assert min(res["purity"]) > 1 - 1e-12 and min(res["copy_purity"]) > 1 - 1e-12


def test_two_heads_on_one_demonstration_are_flagged(tmp_path, capsys):
    task = build_task(d_vocab=4, n_examples=3, seq_len=5)
    model = models.theorem1_model(task.pi, 3, 5, beta=50.0)
    with torch.no_grad():
        model.blocks[0].attn.w_L[2] = model.blocks[0].attn.w_L[0]  # heads 0 and 2 both copy demonstration 0
    res = copyers.copyer_report(model)
    assert res["duplicates"] == {0: ["L0H0", "L0H2"]} and res["uncopied_demos"] == [2]
    assert res["distinct_demos"] == 2
    assert "L0H0 and L0H2 copy demonstration 0" in copyers.duplicate_warning(res)
    # Through the CLI: loud on stdout and recorded in the JSON.
    models.save(model, tmp_path / "dup", task=task)
    copyers.main(["--checkpoint", str(tmp_path / "dup"), "--out", str(tmp_path / "figs")])
    assert "WARNING: DUPLICATE COPYERS" in capsys.readouterr().out
    record = json.loads((tmp_path / "figs" / "copyers.json").read_text())
    assert record["results"]["duplicates"] == {"0": ["L0H0", "L0H2"]}
    assert "DUPLICATE" in record["results"]["warning"]
    assert (tmp_path / "figs" / "copyers.png").is_file()


def test_shipped_checkpoint_heads_distinct_and_pure():
    res = copyers.copyer_report(models.load(models.DEFAULT_CHECKPOINT))
    assert res["distinct_demos"] == 10 and not res["duplicates"]
    assert min(res["purity"]) >= 0.93
