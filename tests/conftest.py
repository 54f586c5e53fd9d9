"""Shared fixtures: every test starts from seeded generators; small builders keep tests short."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from models.training.train import TrainConfig
from probes import MarkovTreeTask


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
