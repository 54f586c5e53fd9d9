"""Proposition 1: the fit ``W ~ c log pi + 1 a^T`` and the column-softmax error, against NumPy
references; Theorem 1 recovers log pi exactly; the shipped checkpoint within the paper's 0.05."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import build_task

import models
from analyses import logpi_recovery as lr
from analyses.common import run_cli
from probes.metrics import column_softmax_error, fit_column_shift


def _np_col_softmax(m: np.ndarray) -> np.ndarray:
    e = np.exp(m - m.max(0, keepdims=True))
    return e / e.sum(0, keepdims=True)


def test_fit_matches_numpy_lstsq():
    rng = np.random.default_rng(1)
    d = 5
    ref = np.log(rng.dirichlet(np.ones(d), size=d))
    block = 2.5 * ref + rng.normal(size=(1, d)) + 0.05 * rng.normal(size=(d, d))
    # Design: vec(block) = c vec(ref) + sum_j a_j vec(1 e_j^T); solve by lstsq.
    design = np.concatenate([ref.reshape(-1, 1), np.kron(np.ones((d, 1)), np.eye(d))], axis=1)
    sol, *_ = np.linalg.lstsq(design, block.reshape(-1), rcond=None)
    c, a, residual, corr = fit_column_shift(torch.tensor(block), torch.tensor(ref))
    assert c == pytest.approx(sol[0], abs=1e-10)
    np.testing.assert_allclose(a.numpy(), sol[1:], atol=1e-10)
    np.testing.assert_allclose(residual.numpy(), block - (design @ sol).reshape(d, d), atol=1e-10)
    bc, rc = block - block.mean(0), ref - ref.mean(0)
    assert corr == pytest.approx(np.corrcoef(bc.ravel(), rc.ravel())[0, 1], abs=1e-10)
    err = np.abs(_np_col_softmax(block / c) - _np_col_softmax(ref))
    got = column_softmax_error(torch.tensor(block / c), torch.tensor(ref))
    assert got == pytest.approx((err.max(), err.mean()), abs=1e-12)


def test_column_softmax_error_ignores_column_shifts_not_row_shifts():
    ref = torch.randn(4, 4, dtype=torch.float64)
    assert column_softmax_error(ref + torch.randn(1, 4, dtype=torch.float64), ref)[0] < 1e-12
    assert column_softmax_error(ref + torch.randn(4, 1, dtype=torch.float64), ref)[0] > 1e-3


def test_theorem1_recovers_log_pi_exactly():
    task = build_task(d_vocab=4, n_examples=3, seq_len=5)
    res = lr.logpi_recovery(models.theorem1_model(task.pi, 3, 5, beta=50.0), task.pi)
    assert [b["demonstration"] for b in res["blocks"]] == [0, 1, 2]
    for b in res["blocks"] + [res["ov"]]:
        assert b["c"] == pytest.approx(1.0, abs=1e-12)
        assert b["error_fitted_max"] < 1e-6 and b["error_unit_max"] < 1e-6
        assert b["correlation"] == pytest.approx(1.0, abs=1e-12)


def test_permuted_heads_and_scaled_blocks_are_labelled_and_fitted():
    """Head k copies demonstration perm[k]; block k is scaled by s_k and column-shifted: the fit must
    return c = s_k, a zero error at the fitted scale, the numpy error at scale 1, and the right label."""
    task = build_task(d_vocab=4, n_examples=3, seq_len=5)
    d, perm, scales = 4, [2, 0, 1], [3.0, 0.5, 1.7]
    model = models.theorem1_model(task.pi, 3, 5, beta=50.0)
    with torch.no_grad():
        model.blocks[0].attn.w_L.fill_(-50.0)
        model.blocks[0].attn.w_L[torch.arange(3), torch.tensor(perm)] = 50.0
        for k, s in enumerate(scales):
            sl = slice((k + 1) * d, (k + 2) * d)
            model.W_KQ[sl, sl] = s * task.pi.log() + torch.randn(1, d, dtype=torch.float64)
    res = lr.logpi_recovery(model, task.pi)
    log_pi = task.pi.log().numpy()
    for k, b in enumerate(res["blocks"]):
        assert b["head"] == f"L0H{k}" and b["demonstration"] == perm[k] and b["purity"] > 0.999
        assert b["c"] == pytest.approx(scales[k], abs=1e-10)
        assert b["error_fitted_max"] < 1e-10
        expected = np.abs(_np_col_softmax(scales[k] * log_pi) - _np_col_softmax(log_pi)).max()
        assert b["error_unit_max"] == pytest.approx(expected, abs=1e-10)


def test_shipped_checkpoint_within_paper_bound():
    model = models.load(models.DEFAULT_CHECKPOINT)
    res = lr.logpi_recovery(model, models.load_task(models.DEFAULT_CHECKPOINT).pi)
    assert res["worst"]["error_fitted_max"] <= lr.CLAIM_FITTED_ERROR
    assert res["min_correlation"] > 0.95
    # Soft copies shrink the scale: the raw blocks are far from log pi at scale 1.
    assert res["worst"]["error_unit_max"] > res["worst"]["error_fitted_max"]


def test_cli_theorem1_writes_numbers(tmp_path):
    lr.main(["--checkpoint", "theorem1:beta=50", "--out", str(tmp_path), "--n-contexts", "64"])
    record = json.loads((tmp_path / "logpi_recovery.json").read_text())
    assert record["checkpoint"] == "theorem1:beta=50" and record["seed"] == 0
    assert record["results"]["worst"]["error_fitted_max"] < 1e-6
    assert record["results"]["ov"]["effective_value"]["error_max"] < 1e-6
    assert (tmp_path / "logpi_recovery.png").is_file() and (tmp_path / "logpi_recovery_errors.pdf").is_file()


def test_cli_bad_checkpoint_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        run_cli(lr.main, ["--checkpoint", str(tmp_path / "nope"), "--out", str(tmp_path)])
    assert e.value.code == 2
    assert "does not exist" in capsys.readouterr().err
