"""A network built only once its parameters and buffers are known to fit in memory (sized on the meta device):
``build(cls, cfg, what)`` for any model class whose config is a dataclass with a ``device`` field (ours,
``models.nets.edelman``'s)."""

from __future__ import annotations

import dataclasses

import torch

from models.plumbing.io import check_memory


def build(cls, cfg, what: str):
    """``cls(cfg)`` once its parameters and buffers are known to fit in memory (``what`` names it in the
    one-line refusal)."""
    check_memory(model_bytes(cls, cfg), what)
    return cls(cfg)


def model_bytes(cls, cfg) -> int:
    """Bytes of the parameters and buffers of ``cls(cfg)``, measured without allocating them."""
    with torch.device("meta"):
        meta = cls(dataclasses.replace(cfg, device="meta"))
    return sum(t.numel() * t.element_size() for t in [*meta.parameters(), *meta.buffers()])
