"""Theorem 1: the construction's attention converges to the BMA posterior as beta grows (float64).
Theorem 2: BMA's mass on the true parent grows with L on a minorised kernel. Checked against the BMA
oracle and a NumPy brute-force posterior."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import build_task, tiny_train_config

from analyses import bma_agreement as ba
from analyses.common import sample_contexts
from models.training.train import train
from probes import MarkovTreeTask


def test_theorem1_tv_decreases_to_float64_precision():
    task = build_task(d_vocab=4, n_examples=3, seq_len=6)
    tokens, _ = sample_contexts(task, 512, seed=1)
    rows = ba.theorem1_sweep(task, tokens, betas=[0.1, 0.3, 1.0, 3.0, 10.0, 50.0], progress=False)["sweep"]
    tv = [r["tv"] for r in rows]
    assert all(b < a for a, b in zip(tv, tv[1:])), tv
    assert tv[0] > 0.1  # at small beta the copies are blurred: far from BMA
    assert rows[-1]["tv"] < 1e-6 and rows[-1]["max_abs"] < 1e-12 and abs(rows[-1]["nll_gap"]) < 1e-12


def _np_parent_mass(pi: np.ndarray, tokens: np.ndarray, parents: np.ndarray, L: int, H: int) -> float:
    """Brute force: posterior of each candidate h' < h from the product of likelihoods over demos."""
    x = tokens.reshape(len(tokens), L + 1, H)
    total, count = 0.0, 0
    for b in range(len(tokens)):
        for h in range(1, H):
            like = np.array([np.prod([pi[x[b, l, hp], x[b, l, h]] for l in range(L)]) for hp in range(h)])
            total += like[parents[b, h]] / like.sum()
            count += 1
    return total / count


def test_bma_parent_mass_matches_brute_force_and_grows_with_L():
    task = build_task(d_vocab=4, n_examples=1, seq_len=6, gamma=0.2)  # minorised: pi >= 0.05
    assert task.pi.min() >= 0.2 / 4 - 1e-12
    lengths = [1, 2, 4, 8, 16, 32]
    rows = ba.bma_vs_length(task.pi, 6, lengths, 4000, seed=3)
    mass = [r["parent_mass"] for r in rows]
    assert all(b > a for a, b in zip(mass, mass[1:])), mass
    small = ba.bma_vs_length(task.pi, 6, [2], 60, seed=5)[0]
    tokens, parents = sample_contexts(MarkovTreeTask(task.pi, 2, 6), 60, 5)
    ref = _np_parent_mass(task.pi.numpy(), tokens.numpy(), parents.numpy(), 2, 6)
    assert small["parent_mass"] == pytest.approx(ref, abs=1e-12)


def test_cli_trains_per_L_and_tracks_bma(tmp_path):
    cfg = tiny_train_config(
        tmp_path, d_vocab=4, alpha=0.3, steps=10, batch_size=64, eval_every=10, out=str(tmp_path / "ck")
    )
    train(cfg, progress=False)
    out = tmp_path / "figs"
    ba.main(
        [
            "--checkpoint",
            str(tmp_path / "ck"),
            "--out",
            str(out),
            "--n-contexts",
            "512",
            "--bma-L",
            "1,4,16",
            "--train-L",
            "4",
            "--train-steps",
            "150",
        ]
    )
    res = json.loads((out / "bma_agreement.json").read_text())["results"]
    assert res["theorem1"]["sweep"][-1]["tv"] < 1e-6
    trained = res["trained_vs_L"]
    assert [r["L"] for r in trained] == [4]
    # The short run learns to find parents: it closes more than half the gap in mass on the true parent
    # between uniform attention over the h candidates (mean of 1/h, h = 1..H-1) and BMA.
    uniform = np.mean([1 / h for h in range(1, 4)])
    r = trained[0]
    assert r["bma_parent_mass"] > uniform + 0.1
    assert r["parent_mass"] - uniform > 0.5 * (r["bma_parent_mass"] - uniform)
    assert (out / "bma_agreement.png").is_file()
    with pytest.raises(SystemExit) as e:
        ba.main(["--train-L", "0,2", "--out", str(out)])
    assert e.value.code == 2
