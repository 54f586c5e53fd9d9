"""Shared fixtures: every test starts from seeded generators; small builders keep tests short."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from probes import MarkovTreeTask


@pytest.fixture(autouse=True)
def _seed_everything():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


def build_task(d_vocab: int = 4, n_examples: int = 3, seq_len: int = 5, seed: int = 0, **kw) -> MarkovTreeTask:
    """A small random task (override any field)."""
    return MarkovTreeTask.random(d_vocab, n_examples, seq_len, seed=seed, **kw)


@pytest.fixture
def small_task() -> MarkovTreeTask:
    return build_task()
