"""Measurements shared by training, the analyses and the tests.

Conventions: attention/posterior tensors are ``[batch, H, H]`` (query h, key h'); row 0 has no
candidates and is excluded from every average, as is everything at positions h = 0 for NLL.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor


def total_variation(p: Float[Tensor, "batch H H"], q: Float[Tensor, "batch H H"]) -> Float[Tensor, "batch H"]:
    """TV distance 0.5 * sum_h' |p - q| per (context, query position)."""
    return 0.5 * (p.double() - q.double()).abs().sum(-1)


def mean_tv(p: Float[Tensor, "batch H H"], q: Float[Tensor, "batch H H"]) -> float:
    """Mean TV over contexts and query positions h >= 1."""
    return total_variation(p, q)[:, 1:].mean().item()


def parent_hits(attention: Float[Tensor, "batch H H"], parents: Int[Tensor, "batch H"]) -> Float[Tensor, "batch H-1"]:
    """1 where the most-attended candidate is the true parent, for h >= 1."""
    return (attention[:, 1:].argmax(-1) == parents[:, 1:].to(attention.device)).double()


def parent_accuracy(attention: Float[Tensor, "batch H H"], parents: Int[Tensor, "batch H"]) -> float:
    """Fraction of (context, h >= 1) where the argmax of the attention is the true parent."""
    return parent_hits(attention, parents).mean().item()


def target_nll(log_probs: Float[Tensor, "batch H d"], tokens: Int[Tensor, "batch T"]) -> float:
    """Mean negative log-likelihood (nats) of the target tokens x_h, h >= 1."""
    H = log_probs.shape[1]
    target = tokens[:, -H:].to(log_probs.device)
    return -log_probs.double().gather(-1, target.unsqueeze(-1))[:, 1:].mean().item()


def demonstration_mass(pattern: Float[Tensor, "K H T"], n_examples: int) -> Float[Tensor, "K L+1"]:
    """Attention mass each copyer head puts on each example (L demonstrations, then the target),
    averaged over query positions. ``pattern`` is one context's ``blocks.0`` pattern."""
    K, H, T = pattern.shape
    return pattern.double().view(K, H, n_examples + 1, T // (n_examples + 1)).sum(-1).mean(1)


def copy_mass(pattern: Float[Tensor, "K H T"], n_examples: int) -> Float[Tensor, "K L+1"]:
    """Attention mass on the SAME position h of each example: the exact-copy share of each head."""
    K, H, T = pattern.shape
    same = pattern.double().view(K, H, n_examples + 1, H).diagonal(dim1=1, dim2=3)  # [K, L+1, H]
    return same.mean(-1)


def head_assignment(pattern: Float[Tensor, "K H T"], n_examples: int) -> tuple[list[int], list[float]]:
    """For each copyer head, the demonstration it attends to most and the mass it puts there."""
    mass = demonstration_mass(pattern, n_examples)[:, :n_examples]
    purity, demo = mass.max(-1)
    return demo.tolist(), purity.tolist()
