"""Shared fixtures: every test starts from seeded generators; small builders keep tests short. ``SLOW``:
the tests marked ``slow`` (``python -m pytest -m "not slow"`` leaves them out)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from models.training.train import TrainConfig
from probes import MarkovTreeTask


# The heaviest tests, by file and function (every parametrisation), marked `slow` here rather than in their
# files so that one table says what a quick run leaves out (tests/README.md); a new slow test may instead
# carry @pytest.mark.slow. Measured with --durations=0 (seconds of wall time on the loaded 2-core machine of
# 2026-12-03, about 6x an idle one; tests/project/test_slow_marker.py checks every entry names a test).
SLOW = {
}


def pytest_collection_modifyitems(items):
    for item in items:
        if f"{item.path.name}::{item.originalname}" in SLOW:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _seed_everything():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


def build_task(d_vocab: int = 4, n_examples: int = 3, seq_len: int = 5, seed: int = 0, **kw) -> MarkovTreeTask:
    """A small random task (override any field)."""
    return MarkovTreeTask.random(d_vocab, n_examples, seq_len, seed=seed, **kw)


def tiny_train_config(tmp_path, **kw) -> TrainConfig:
    """A training run of a few seconds into ``tmp_path / "run"`` (override any field)."""
    base = dict(
        d_vocab=3,
        n_examples=2,
        seq_len=4,
        steps=12,
        batch_size=16,
        eval_every=6,
        eval_contexts=32,
        out=str(tmp_path / "run"),
    )
    return TrainConfig(**{**base, **kw})


@pytest.fixture
def small_task() -> MarkovTreeTask:
    return build_task()
