"""Theorem 1: the analytic construction whose layer-2 attention is the BMA posterior as beta -> inf."""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from models.nets.build import build
from models.nets.causal_transformer import CausalTransformer, CausalTransformerConfig
from probes.tasks import check_distribution, check_kernel

# The copyers' scores add two weights of +-beta (w_H + w_L): beta up to 1e300 keeps them, and every
# softmax over them, finite in float64 (float64 overflows at 1.8e308: beta=1e308 gave NaN metrics).
MAX_BETA = 1e300


@torch.no_grad()
def theorem1_model(
    pi: Float[Tensor, "d d"],
    n_examples: int,
    seq_len: int,
    beta: float,
    root: Float[Tensor, " d"] | None = None,
    dtype: str = "float64",
) -> CausalTransformer:
    """docs/paper.md section 4 with K = L: head k copies demonstration k at the same position
    (``w_H[0] = w_L[k] = +beta``, everything else ``-beta``, the target prefix included);
    ``W_KQ = blockdiag(0, log pi, ..., log pi)``; ``W_OV`` token block ``log pi``; ``b_root = log root``.
    """
    pi = check_kernel(pi)
    if (pi == 0).any():
        raise ValueError("Theorem 1 needs log pi finite, but pi has zero entries; use a kernel with pi > 0")
    if not 0 < beta <= MAX_BETA:
        raise ValueError(f"beta must be in (0, {MAX_BETA:g}], got {beta}")
    d, L, H = pi.shape[0], n_examples, seq_len
    cfg = CausalTransformerConfig(d, L, H, n_copy_heads=L, dtype=dtype)
    model = build(CausalTransformer, cfg, f"the Theorem 1 construction (d={d}, L=K={L}, H={H})")
    copy, select = model.blocks[0].attn, model.blocks[1].attn
    copy.w_H.fill_(-beta)
    copy.w_H[:, H - 1] = beta  # offset 0
    copy.w_L.fill_(-beta)
    copy.w_L[:, :L].diagonal().fill_(beta)  # head k -> demonstration k
    log_pi = pi.log().to(select.W_KQ.dtype)
    for k in range(1, L + 1):
        select.W_KQ[k * d : (k + 1) * d, k * d : (k + 1) * d] = log_pi
    select.W_OV[:d] = log_pi
    root = torch.full((d,), 1 / d, dtype=torch.float64) if root is None else check_distribution(root, d)
    model.b_root.copy_(root.log())
    return model.eval()
