"""Plain baselines the benchmark measures our code against.

``reference_model`` swaps the copyer layer of a ``CausalTransformer`` for ``FullMatrixCopyer``, the
way published code for relative-position-encoded transformers computes attention: the full
``((L+1)H) x ((L+1)H)`` score matrix per head, every query row of the flat context, and only then
the H target rows that feed layer 2. ``bma_posterior_loop`` is Lemma 1 written as a per-context loop.
Both give the same numbers as the code they are compared with (the benchmark checks it each run).
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from models.nets.causal_transformer import CausalTransformer


class FullMatrixCopyer(nn.Module):
    """K relative-position heads over the whole flat context: score from query (l, h) to key (l', h')
    is ``w_H[k, h' - h + H - 1] + w_L[k, l']``, causal over the flat index (the target rows also mask
    their own position: the token at h is what is predicted)."""

    def __init__(self, w_H: Float[Tensor, "K 2H-1"], w_L: Float[Tensor, "K L+1"], n_examples: int, seq_len: int):
        super().__init__()
        self.w_H = nn.Parameter(w_H.detach().clone())
        self.w_L = nn.Parameter(w_L.detach().clone())
        L, H = n_examples, seq_len
        T = (L + 1) * H
        pos = torch.arange(T, device=w_H.device)
        example, within = pos // H, pos % H
        self.register_buffer("rel", within.view(1, T) - within.view(T, 1) + H - 1, persistent=False)  # [query, key]
        self.register_buffer("key_example", example, persistent=False)
        query, key = pos.view(T, 1), pos.view(1, T)
        mask = (key > query) | ((key == query) & (query >= L * H))
        self.register_buffer("mask", mask, persistent=False)
        self.seq_len = H

    def forward(self, x: Float[Tensor, "batch T d"]) -> tuple[Float[Tensor, "batch H K d"], None]:
        scores = self.w_H[:, self.rel] + self.w_L[:, self.key_example].unsqueeze(1)  # [K, T, T]
        pattern = scores.masked_fill(self.mask, float("-inf")).softmax(-1)
        u = torch.einsum("kij,bjd->bikd", pattern, x)  # every row: [batch, T, K, d]
        return u[:, -self.seq_len :], None


def reference_model(model: CausalTransformer) -> CausalTransformer:
    """A copy of ``model`` (same weights) whose copyer layer materialises the full score matrix."""
    ref = copy.deepcopy(model)
    attn = model.blocks[0].attn
    ref.blocks[0].attn = FullMatrixCopyer(attn.w_H, attn.w_L, model.cfg.n_examples, model.cfg.seq_len)
    return ref


def bma_posterior_loop(
    pi: Float[Tensor, "d d"], tokens: Int[Tensor, "batch T"], n_examples: int, seq_len: int
) -> Float[np.ndarray, "batch H H"]:
    """Lemma 1 one context, one query h and one candidate h' at a time (NumPy, float64)."""
    log_pi = np.log(np.asarray(pi, dtype=np.float64))
    contexts = np.asarray(tokens).reshape(-1, n_examples + 1, seq_len)[:, :n_examples]
    out = np.zeros((len(contexts), seq_len, seq_len))
    for b, demos in enumerate(contexts):
        for h in range(1, seq_len):
            scores = np.array([log_pi[demos[:, hp], demos[:, h]].sum() for hp in range(h)])
            weights = np.exp(scores - scores.max())
            out[b, h, :h] = weights / weights.sum()
    return out
