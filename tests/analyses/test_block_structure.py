"""Block structure of W_KQ: block norms against a NumPy loop, the ratio on constructed models, the
shipped checkpoint's claim, and snapshots of a tiny training run (which must all survive training)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import build_task

import models
from analyses import block_structure as bs
from models.training import short_run
from models.training.train import TrainConfig, train
from probes.metrics import block_norms


def test_block_norms_match_numpy_loop():
    W = torch.randn(12, 8, dtype=torch.float64)
    ref = np.array(
        [[np.linalg.norm(W.numpy()[4 * i : 4 * i + 4, 4 * j : 4 * j + 4]) for j in range(2)] for i in range(3)]
    )
    np.testing.assert_allclose(block_norms(W, 4).numpy(), ref, rtol=1e-12)
    with pytest.raises(ValueError, match="does not split"):
        block_norms(W, 5)


def test_theorem1_is_exactly_block_diagonal_and_constructed_ratio():
    task = build_task(d_vocab=4, n_examples=3, seq_len=5)
    model = models.theorem1_model(task.pi, 3, 5, beta=50.0)
    res = bs.block_structure(model)
    assert res["ratio"] == 0.0 and res["token_key_row"].abs().max() == 0 and res["token_query_column"].abs().max() == 0
    diag = torch.linalg.norm(task.pi.log()).item()
    # One off-diagonal copy block (key copy of head 0, query copy of head 2) with norm 3.
    with torch.no_grad():
        extra = torch.randn(4, 4, dtype=torch.float64)
        model.W_KQ[4:8, 12:16] = 3.0 * extra / extra.norm()
        model.W_KQ[0:4, 8:12] = 1.0  # key-token row, query copy of head 1: norm 4, not a copy block
    res = bs.block_structure(model)
    assert res["ratio"] == pytest.approx((3.0 / 6) / diag, rel=1e-12)
    assert res["off_max"] == pytest.approx(3.0, rel=1e-12)
    assert res["token_key_row"].tolist() == pytest.approx([0.0, 4.0, 0.0])


def test_shipped_checkpoint_is_block_diagonal():
    res = bs.block_structure(models.load(models.DEFAULT_CHECKPOINT))
    assert res["ratio"] <= bs.CLAIM_RATIO
    assert res["token_query_column"].abs().max() == 0  # the query's token subspace is masked
    assert (
        res["head_demo"]
        == json.loads((models.DEFAULT_CHECKPOINT / "config.json").read_text())["training"]["history"][-1]["head_demo"]
    )


def train_tiny(out, steps: int, snapshot_every: int = 10):
    """A tiny training run into ``out`` (evaluated every 10 steps) with a snapshot every ``snapshot_every``
    steps; returns the final model."""
    cfg = TrainConfig(
        d_vocab=3,
        n_examples=2,
        seq_len=4,
        steps=steps,
        batch_size=32,
        eval_every=10,
        eval_contexts=32,
        snapshot_every=snapshot_every,
        out=str(out),
    )
    return train(cfg, progress=False)[0]


def test_snapshots_of_a_training_run_survive_and_are_measured(tmp_path):
    model = train_tiny(tmp_path / "run", 30)
    snaps = short_run.find_snapshots(tmp_path / "run")
    assert [s for s, _ in snaps] == [10, 20, 30]
    series = bs.emergence(snaps, progress=False)
    # The last snapshot is the final model: same block norms as measured directly.
    torch.testing.assert_close(series[-1]["norms"], block_norms(model.W_KQ, 3), rtol=0, atol=0)
    assert all(np.isfinite(s["ratio"]) for s in series)
    with pytest.raises(ValueError, match="no step_XXXXXX"):
        short_run.find_snapshots(tmp_path)


def test_snapshots_between_evaluations_are_kept_and_distinct(tmp_path):
    # A snapshot every 5 steps with evaluations every 10: every fifth step is kept, not only the evaluated ones.
    model = train_tiny(tmp_path / "run", 20, snapshot_every=5)
    snaps = short_run.find_snapshots(tmp_path / "run")
    assert [s for s, _ in snaps] == [5, 10, 15, 20]
    weights = [models.load(p).W_KQ.detach() for _, p in snaps]
    assert all(not torch.equal(a, b) for i, a in enumerate(weights) for b in weights[i + 1 :])
    torch.testing.assert_close(weights[-1], model.W_KQ.detach(), rtol=0, atol=0)
    assert [s["step"] for s in bs.emergence(snaps, progress=False)] == [5, 10, 15, 20]


def test_cli_with_snapshots(tmp_path):
    train_tiny(tmp_path / "run", 20)
    out = tmp_path / "figs"
    bs.main(["--checkpoint", str(tmp_path / "run"), "--snapshots", str(tmp_path / "run"), "--out", str(out)])
    record = json.loads((out / "block_structure.json").read_text())
    assert [s["step"] for s in record["results"]["emergence"]] == [10, 20]
    assert (out / "block_structure_emergence.png").is_file()
    with pytest.raises(SystemExit) as e:
        bs.main(["--snapshot-every", "0", "--out", str(out)])
    assert e.value.code == 2
