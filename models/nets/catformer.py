"""Nichani et al.'s CatFormer (``eshnich/transformers-learn-causal-structure``, ``catformer.py``): an
attention-only transformer whose residual is a concatenation, any number of layers and heads, written here
from its equations (their repository has no licence) as a ``transformer_lens.HookedRootModule``:

    x_0 = [onehot(token) | onehot(position)]                       hook_embed     [batch, pos, d + T]
    per layer i, head j (A_i: [n_heads_i, d_i, d_i]):
      scores = x_i A_ij x_i^T, causal mask -inf                    blocks.{i}.attn.hook_attn_scores [batch, head, q, k]
      z_j = softmax(scores) x_i                                    blocks.{i}.attn.hook_pattern, hook_z [batch, pos, head, d_i]
      x_{i+1} = [x_i | z_0 | z_1 | ...]   (d_{i+1} = d_i (1 + n_heads_i))   blocks.{i}.hook_resid_post
    logits = x_L W                                                 hook_logits    [batch, pos, d]

Theirs reads the last position only (``softmax(x[..., -1, :] @ W)``); here every position's read-out is
returned, the last one theirs. No biases, no scaling, no LayerNorm: A is the only attention weight, the
bilinear form over the named blocks of the concatenated residual (``residual_blocks``: token, position, and
each earlier head's copy), which ``analyses.block_structure`` reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint


@dataclass
class CatFormerConfig:
    d_vocab: int  # their vocab_size
    n_ctx: int  # their seq_len T: the one-hot positions, so every input has exactly T tokens
    heads: list[int] = field(default_factory=lambda: [1, 1])  # heads per layer (theirs: [1, 1])
    device: str = "cpu"

    @property
    def n_layers(self) -> int:
        return len(self.heads)

    def widths(self) -> list[int]:
        """d_i, the residual width entering layer i, then the read-out's: d_0 = d + T, d_{i+1} = d_i (1 + n_i)."""
        out = [self.d_vocab + self.n_ctx]
        for n in self.heads:
            out.append(out[-1] * (1 + n))
        return out


class CatFormerAttention(nn.Module):
    def __init__(self, n_heads: int, width: int):
        super().__init__()
        self.A = nn.Parameter(torch.zeros(n_heads, width, width))
        self.hook_attn_scores = HookPoint()  # [batch, head, q, k]
        self.hook_pattern = HookPoint()  # [batch, head, q, k]
        self.hook_z = HookPoint()  # [batch, pos, head, d_i]: each head's copy of the residual

    def forward(self, x: Float[Tensor, "batch pos d_i"]) -> Float[Tensor, "batch pos head_d_i"]:
        T = x.shape[1]
        scores = torch.einsum("bid,hde,ble->bhil", x, self.A, x)
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        scores = self.hook_attn_scores(scores.masked_fill(~causal, float("-inf")))
        pattern = self.hook_pattern(scores.softmax(-1))
        z = self.hook_z(torch.einsum("bhil,bld->bihd", pattern, x))
        return z.flatten(2)  # head-major, as their vmap over heads then reshape


class CatFormerBlock(nn.Module):
    def __init__(self, n_heads: int, width: int):
        super().__init__()
        self.attn = CatFormerAttention(n_heads, width)
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_i]
        self.hook_resid_post = HookPoint()  # [batch, pos, d_{i+1}]

    def forward(self, x: Float[Tensor, "batch pos d_i"]) -> Float[Tensor, "batch pos d_next"]:
        x = self.hook_resid_pre(x)
        return self.hook_resid_post(torch.cat([x, self.attn(x)], -1))


class CatFormer(HookedRootModule):
    """The model of the module docstring; ``forward(ids [batch, T]) -> logits [batch, T, d]``."""

    def __init__(self, cfg: CatFormerConfig):
        super().__init__()
        if not cfg.heads or any(not isinstance(n, int) or n < 1 for n in cfg.heads):
            raise ValueError(f"CatFormer heads must be a non-empty list of positive integers, got {cfg.heads!r}")
        self.cfg = cfg
        widths = cfg.widths()
        self.blocks = nn.ModuleList(CatFormerBlock(n, w) for n, w in zip(cfg.heads, widths))
        self.W = nn.Parameter(torch.zeros(widths[-1], cfg.d_vocab))
        self.hook_embed = HookPoint()  # [batch, pos, d + T]
        self.hook_logits = HookPoint()  # [batch, pos, d]
        self.setup()

    @property
    def n_heads(self) -> list[int]:
        return list(self.cfg.heads)

    def forward(self, ids: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d"]:
        T, d = self.cfg.n_ctx, self.cfg.d_vocab
        if ids.shape[-1] != T:
            raise ValueError(f"a CatFormer of T = {T} one-hot positions reads exactly {T} tokens, got {ids.shape[-1]}")
        dtype = self.W.dtype
        pos = torch.eye(T, dtype=dtype, device=ids.device).expand(ids.shape[0], T, T)
        x = self.hook_embed(torch.cat([F.one_hot(ids, d).to(dtype), pos], -1))
        for block in self.blocks:
            x = block(x)
        return self.hook_logits(x @ self.W)

    def last_logits(self, ids: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch d"]:
        """Their ``__call__``'s logits (the last position's, before the softmax) without hooks, for training:
        ``forward(ids)[:, -1]`` computed in fewer operations. Layer 0 reads the one-hot structure of x_0 (the
        token part of a key through a d-wide product, its position part read off the scores: x_l's position
        block is e_l); the last layer reads the last query only (nothing after it reads the others)."""
        T, d = self.cfg.n_ctx, self.cfg.d_vocab
        if ids.shape[-1] != T:
            raise ValueError(f"a CatFormer of T = {T} one-hot positions reads exactly {T} tokens, got {ids.shape[-1]}")
        b, dtype = ids.shape[0], self.W.dtype
        onehot = F.one_hot(ids, d).to(dtype)  # [b, T, d]
        x = torch.cat([onehot, torch.eye(T, dtype=dtype, device=ids.device).expand(b, T, T)], -1)
        future = ~torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()
        for i, block in enumerate(self.blocks):
            last = i == len(self.blocks) - 1
            q = x[:, -1:] if last else x  # [b, Q, d_i]
            qa = torch.einsum("bqd,hde->bhqe", q, block.attn.A)  # [b, head, Q, d_i]
            if i == 0:
                scores = torch.matmul(qa[..., :d], onehot.unsqueeze(1).transpose(-1, -2)) + qa[..., d : d + T]
            else:
                scores = torch.matmul(qa, x.unsqueeze(1).transpose(-1, -2))  # [b, head, Q, T]
            if not last:
                scores = scores.masked_fill(future, float("-inf"))
            pattern = scores.softmax(-1)
            if i == 0:  # pattern @ x_0 = [pattern @ onehot | pattern]
                z = torch.cat([torch.matmul(pattern, onehot.unsqueeze(1)), pattern], -1)
            else:
                z = torch.matmul(pattern, x.unsqueeze(1))  # [b, head, Q, d_i]
            x = torch.cat([q, z.transpose(1, 2).flatten(2)], -1)  # head-major, as forward
        return x[:, -1] @ self.W

    @torch.no_grad()
    def positional_attention(self, layer: int = 0, head: int = 0) -> Float[Tensor, "T T"]:
        """Nichani et al.'s reading of a head: the softmax of the causally masked position-position block of
        its A alone (``many_graphs.ipynb``: ``softmax(where(tri(T), A[d:, d:], -inf))``), float64, ``[query, key]``."""
        d, T = self.cfg.d_vocab, self.cfg.n_ctx
        P = self.blocks[layer].attn.A[head, d : d + T, d : d + T].detach().double().cpu()
        return P.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")).softmax(-1)

    def residual_blocks(self, layer: int) -> list[tuple[str, int, int]]:
        """The named blocks of the residual entering ``layer``: (name, start, stop), in order: ``token``,
        ``position``, then each earlier layer's heads' copies ``L{i}H{j} copy`` (each a whole d_i residual)."""
        d, T = self.cfg.d_vocab, self.cfg.n_ctx
        out, start = [("token", 0, d), ("position", d, d + T)], d + T
        for i, (n, w) in enumerate(zip(self.cfg.heads[:layer], self.cfg.widths())):
            for j in range(n):
                out.append((f"L{i}H{j} copy", start, start + w))
                start += w
        return out
