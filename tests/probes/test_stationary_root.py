"""``root=stationary`` (the peers' roots): each context's first token from its own chain's stationary
distribution. A fixed kernel's is a fixed root with an exact oracle; under per-context Dirichlet rows the
oracle refuses in one line (no closed form)."""

from __future__ import annotations

import pytest
import torch

from probes.graph_task import make_task
from probes.oracles import bayes, check_bayes


def stationary_by_power(P: torch.Tensor) -> torch.Tensor:
    """An independent computation: a row of P^(2^12)."""
    return torch.linalg.matrix_power(P.double(), 4096)[0]


def test_dirichlet_roots_follow_each_contexts_stationary_distribution():
    task = make_task("chain:kernel=dirichlet:root=stationary", 3, 0, 6, alpha=1.0)
    P = torch.tensor([[0.8, 0.1, 0.1], [0.3, 0.3, 0.4], [0.05, 0.05, 0.9]], dtype=torch.float64)
    n = 200_000
    x, _ = task.sample(n, torch.Generator().manual_seed(0), kernels={1: P.expand(n, 3, 3)})
    freq = x[:, 0].bincount(minlength=3).double() / n
    mu = stationary_by_power(P)
    assert (freq - mu).abs().max() < 4 * (mu * (1 - mu) / n).sqrt().max()  # 4 standard errors
    uniform = make_task("chain:kernel=dirichlet", 3, 0, 6, alpha=1.0)
    y, _ = uniform.sample(n, torch.Generator().manual_seed(0), kernels={1: P.expand(n, 3, 3)})
    assert (y[:, 0].bincount(minlength=3).double() / n - 1 / 3).abs().max() < 0.005  # the default is uniform
    with pytest.raises(ValueError, match="no exact Bayes predictive"):
        check_bayes(task)
    with pytest.raises(ValueError, match="no exact Bayes predictive"):
        bayes(task, x[:4])


def test_a_fixed_kernels_stationary_root_is_exact():
    task = make_task("chain:root=stationary", 3, 0, 5, alpha=1.0, gamma=0.2, task_seed=3)
    mu = stationary_by_power(task.pi)
    assert torch.allclose(task.root, mu, atol=1e-12)
    x, _ = task.sample(8, torch.Generator().manual_seed(1))
    lp, _ = bayes(task, x)
    assert torch.allclose(lp[:, 0].exp(), mu.expand(8, 3), atol=1e-12)  # row 0: the root, then the chain
    assert torch.allclose(lp[:, 1].exp(), task.pi[x[:, 0]], atol=1e-12)


def test_bad_root_options_are_one_line():
    with pytest.raises(ValueError, match="uniform or stationary"):
        make_task("chain:root=first", 3, 0, 5)
    with pytest.raises(ValueError, match="one parent"):
        make_task("given:parents=[[],[],[0,1]]:kernel=dirichlet:root=stationary", 3, 0, 3)
