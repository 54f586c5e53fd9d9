"""The learning-rate schedule every trainer uses: linear warm-up, then cosine decay to a floor."""

from __future__ import annotations

import math


def cosine_factor(step: int, total: int, final_fraction: float = 0.0, warmup: int = 0) -> float:
    """Multiplier of the base learning rate at ``step`` (0-based) of ``total``: ``(step + 1) / warmup``
    during warm-up, then ``final + (1 - final) (1 + cos(pi t)) / 2`` with t from 0 to 1 over the rest."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min((step - warmup) / max(total - warmup, 1), 1.0)
    return final_fraction + (1 - final_fraction) * 0.5 * (1 + math.cos(math.pi * progress))
