"""Linear probes: a ridge-regression classifier (one-hot targets, argmax) on activations, with held-out accuracy and a
shuffled-label control (the same probe trained and tested on randomly permuted labels, which no
activation can encode: its accuracy is the floor a real signal must clear).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor


@dataclass
class ProbeResult:
    train_acc: float
    test_acc: float  # held-out accuracy on the true labels
    control_acc: float  # held-out accuracy of a probe trained on shuffled labels
    majority_acc: float  # held-out accuracy of always predicting the most frequent training label
    n_train: int
    n_test: int

    def to_dict(self) -> dict:
        return asdict(self)


def fit_ridge(x: Float[Tensor, "n f"], y: Int[Tensor, " n"], n_classes: int, l2: float = 1e-3) -> Tensor:
    """Closed-form ridge regression of one-hot labels on ``[x, 1]``: weights ``[f+1, n_classes]``.
    The argmax of ``[x, 1] @ W`` is a linear classifier (fast, exact, deterministic)."""
    x1 = torch.cat([x.double(), torch.ones(len(x), 1, dtype=torch.float64)], 1)
    target = torch.nn.functional.one_hot(y, n_classes).double()
    gram = x1.T @ x1 + l2 * len(x) * torch.eye(x1.shape[1], dtype=torch.float64)
    return torch.linalg.solve(gram, x1.T @ target)


def linear_probe(
    features: Float[Tensor, "n f"],
    labels: Int[Tensor, " n"],
    n_classes: int,
    seed: int = 0,
    test_fraction: float = 0.25,
    l2: float = 1e-3,
) -> ProbeResult:
    """Fit on a random (seeded) split, standardising with training statistics; report held-out accuracy
    next to the shuffled-label control and the majority baseline."""
    features, labels = torch.as_tensor(features).double(), torch.as_tensor(labels).long()
    if features.ndim != 2 or labels.shape != (features.shape[0],):
        raise ValueError(f"need features [n, f] and labels [n], got {tuple(features.shape)} and {tuple(labels.shape)}")
    if labels.numel() and (labels.min() < 0 or labels.max() >= n_classes):
        raise ValueError(f"labels must lie in [0, {n_classes}), got [{labels.min().item()}, {labels.max().item()}]")
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    n = len(labels)
    n_test = round(n * test_fraction)
    if n_test < 1 or n - n_test < 2:
        raise ValueError(f"need more samples for a train/test split, got {n}")
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=g)
    test, train = order[:n_test], order[n_test:]
    mean, std = features[train].mean(0), features[train].std(0).clamp_min(1e-8)
    x = (features - mean) / std
    shuffled = labels[torch.randperm(n, generator=g)]

    def accuracy(y: Tensor) -> tuple[float, float]:
        w = fit_ridge(x[train], y[train], n_classes, l2)
        pred = (torch.cat([x, torch.ones(n, 1, dtype=torch.float64)], 1) @ w).argmax(-1)
        return (pred[train] == y[train]).double().mean().item(), (pred[test] == y[test]).double().mean().item()

    train_acc, test_acc = accuracy(labels)
    _, control_acc = accuracy(shuffled)
    majority = torch.bincount(labels[train], minlength=n_classes).argmax()
    return ProbeResult(
        train_acc, test_acc, control_acc, (labels[test] == majority).double().mean().item(), len(train), n_test
    )
