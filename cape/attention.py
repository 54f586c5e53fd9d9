"""CAPE step 3 (arXiv 2509.16629): the rotary form of causality-induced positional encoding.

Each feature v has angles ``phi_v`` [n] (``cape.embedding``: ``phi_v = (pi/4) e_v`` from its
Poincare-ball embedding). ``R(phi)`` is block diagonal with 2x2 blocks
``[[cos phi_b, -sin phi_b], [sin phi_b, cos phi_b]]`` acting on coordinates (2b, 2b+1) of a 2n-vector.
Since ``R(a)^T R(b) = R(b - a)``, the score ``q_m^T R(phi_n - phi_m) k_n`` is computed as RoPE does,
``(R(phi_m) q_m)^T (R(phi_n) k_n)``: it depends on the features' angles only through ``phi_n - phi_m``.
The features are non-sequential, so there is no causal mask.
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint


def rotate(x: Float[Tensor, "... two_n"], phi: Float[Tensor, "... n"]) -> Float[Tensor, "... two_n"]:
    """``R(phi) x``: rotate each coordinate pair (2b, 2b+1) of ``x`` by ``phi_b``."""
    if x.shape[-1] != 2 * phi.shape[-1]:
        raise ValueError(f"x has {x.shape[-1]} features; expected 2 * n = {2 * phi.shape[-1]} for n angles")
    x0, x1 = x[..., 0::2], x[..., 1::2]
    c, s = torch.cos(phi), torch.sin(phi)
    return torch.stack([c * x0 - s * x1, s * x0 + c * x1], -1).flatten(-2)


def rotary_scores(
    q: Float[Tensor, "... M two_n"], k: Float[Tensor, "... M two_n"], phi: Float[Tensor, "M n"]
) -> Float[Tensor, "... M M"]:
    """``S[..., m, n] = q_m^T R(phi_n - phi_m) k_n`` (unscaled)."""
    return rotate(q, phi) @ rotate(k, phi).transpose(-1, -2)


class CapeAttention(HookedRootModule):
    """One multi-head self-attention layer over M features with CAPE rotary scores.

    ``forward(x [B,M,d_model], phi [M,d_head/2]) -> [B,M,d_model]``. Hooks: ``hook_q``/``hook_k``
    [B,M,heads,d_head] (before rotation), ``hook_attn_scores``/``hook_pattern`` [B,heads,M,M] (row m =
    query feature m), ``hook_z`` [B,M,heads,d_head]. ``phi=None`` gives no positional encoding."""

    def __init__(self, d_model: int, n_heads: int, d_head: int, seed: int = 0):
        super().__init__()
        if d_head % 2 or min(d_model, n_heads, d_head) < 1:
            raise ValueError(f"need positive sizes and an even d_head, got {d_model=}, {n_heads=}, {d_head=}")
        g = torch.Generator().manual_seed(seed)
        self.n_heads, self.d_head = n_heads, d_head

        def init(*shape, fan_in):
            return nn.Parameter(torch.randn(*shape, generator=g) / math.sqrt(fan_in))

        self.W_Q = init(n_heads, d_model, d_head, fan_in=d_model)
        self.W_K = init(n_heads, d_model, d_head, fan_in=d_model)
        self.W_V = init(n_heads, d_model, d_head, fan_in=d_model)
        self.W_O = init(n_heads, d_head, d_model, fan_in=n_heads * d_head)
        self.hook_q, self.hook_k, self.hook_z = HookPoint(), HookPoint(), HookPoint()
        self.hook_attn_scores, self.hook_pattern = HookPoint(), HookPoint()
        self.setup()

    def forward(
        self, x: Float[Tensor, "B M d_model"], phi: Float[Tensor, "M n"] | None
    ) -> Float[Tensor, "B M d_model"]:
        M = x.shape[1]
        if phi is not None and tuple(phi.shape) != (M, self.d_head // 2):
            raise ValueError(
                f"phi must have shape ({M}, {self.d_head // 2}) = (features, d_head/2), got {tuple(phi.shape)}"
            )
        q = self.hook_q(torch.einsum("bmd,hde->bmhe", x, self.W_Q.to(x.dtype)))
        k = self.hook_k(torch.einsum("bmd,hde->bmhe", x, self.W_K.to(x.dtype)))
        v = torch.einsum("bmd,hde->bmhe", x, self.W_V.to(x.dtype))
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # [B,heads,M,d_head]
        if phi is None:
            scores = q @ k.transpose(-1, -2)
        else:
            scores = rotary_scores(q, k, phi.to(x.dtype))
        scores = self.hook_attn_scores(scores / math.sqrt(self.d_head))
        pattern = self.hook_pattern(scores.softmax(-1))
        z = self.hook_z(torch.einsum("bhmn,bnhe->bmhe", pattern, v))
        return torch.einsum("bmhe,hed->bmd", z, self.W_O.to(x.dtype))
