"""Edelman et al.'s attention-only transformer with relative positions (``EzraEdelman/Evolution-of-Statistical-
Induction-Heads``, ``mingpt/model_rpe.py``'s ``Relative_Transformer``, MIT) as a ``transformer_lens.HookedRootModule``,
in evaluation mode (no dropout); their parameter names under ``blocks.{i}`` instead of ``layers.{i}``:

    resid = wte[ids]                                                  hook_embed      [batch, pos, d_model]
    per layer i (pre-norm; layer 0 has n_head heads, later layers one):
      q, k, v = ln(resid) @ Q/K/V (no bias)                           [batch, head, pos, d_head]
      r[t, s] = wpe[pos(t, s)], pos = t - s for s <= t, else the zero padding row
      scores = (q_t.k_s + q_t.r[t, s]) / sqrt(d_head), causal mask    attn.hook_attn_scores [batch, head, q, k]
      z = softmax(scores) v                                           attn.hook_pattern, attn.hook_z [batch, pos, head, d_head]
      resid = resid + z @ c_proj                                      hook_attn_out, then (attention_only False)
      resid = resid + c_proj(relu(c_fc(ln_2(resid))))                 hook_mlp_out; hook_resid_post
    logits = lm_head(ln_f(resid))                                     [batch, pos, vocab]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint


@dataclass
class EdelmanConfig:
    """The fields of their ``CfgNode`` the model reads."""

    n_layer: int
    n_head: int  # heads of layer 0 (their later layers have one)
    n_embd: int
    vocab_size: int
    block_size: int
    attention_only: bool = True
    device: str = "cpu"

    def __post_init__(self):
        """Each size a positive integer and ``n_embd`` a multiple of ``n_head``: one ``ValueError`` naming the
        field, what it is and what is expected (not a ZeroDivisionError from the layer that divides)."""
        for name in ("n_layer", "n_head", "n_embd", "vocab_size", "block_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r}; expected an integer >= 1")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not a multiple of n_head={self.n_head}; expected one")

    @property
    def heads(self) -> list[int]:
        return [self.n_head] + [1] * (self.n_layer - 1)


class RelativeAttention(nn.Module):
    def __init__(self, cfg: EdelmanConfig, n_head: int):
        super().__init__()
        C = cfg.n_embd
        if C % n_head:
            raise ValueError(f"n_embd={C} must be a multiple of n_head={n_head}")
        self.n_head = n_head
        self.Q, self.K, self.V, self.c_proj = (nn.Linear(C, C, bias=False) for _ in range(4))
        self.wpe = nn.Embedding(cfg.block_size + 1, C, padding_idx=cfg.block_size)
        pos = torch.arange(cfg.block_size)
        rel = pos.view(-1, 1) - pos.view(1, -1)
        self.register_buffer("pos", torch.where(rel < 0, cfg.block_size, rel), persistent=False)
        self.hook_attn_scores = HookPoint()  # [batch, head, q, k]
        self.hook_pattern = HookPoint()  # [batch, head, q, k]
        self.hook_z = HookPoint()  # [batch, pos, head, d_head]

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        B, T, C = x.shape
        h, e = self.n_head, C // self.n_head
        q, k, v = (m(x).view(B, T, h, e).transpose(1, 2) for m in (self.Q, self.K, self.V))
        rel = self.wpe(self.pos[:T, :T]).view(T, T, h, e)
        scores = (q @ k.transpose(-2, -1) + torch.einsum("tshe,bhte->bhts", rel, q)) / math.sqrt(e)
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        scores = self.hook_attn_scores(scores.masked_fill(~causal, float("-inf")))
        pattern = self.hook_pattern(scores.softmax(-1))
        z = self.hook_z((pattern @ v).transpose(1, 2))  # [batch, pos, head, d_head]
        return self.c_proj(z.reshape(B, T, C))


class EdelmanBlock(nn.Module):
    def __init__(self, cfg: EdelmanConfig, n_head: int):
        super().__init__()
        C = cfg.n_embd
        self.ln = nn.LayerNorm(C)
        self.attn = RelativeAttention(cfg, n_head)
        self.attention_only = cfg.attention_only
        if not cfg.attention_only:
            self.ln_2 = nn.LayerNorm(C)
            self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(C, 4 * C), c_proj=nn.Linear(4 * C, C)))
            self.hook_mlp_out = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        self.hook_attn_out = HookPoint()  # [batch, pos, d_model]
        self.hook_resid_post = HookPoint()  # [batch, pos, d_model]

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        x = self.hook_resid_pre(x)
        x = x + self.hook_attn_out(self.attn(self.ln(x)))
        if not self.attention_only:
            x = x + self.hook_mlp_out(self.mlp.c_proj(F.relu(self.mlp.c_fc(self.ln_2(x)))))
        return self.hook_resid_post(x)


class EdelmanTransformer(HookedRootModule):
    """The model of the module docstring; ``forward(ids [batch, T]) -> logits [batch, T, vocab]``."""

    def __init__(self, cfg: EdelmanConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.blocks = nn.ModuleList(EdelmanBlock(cfg, n) for n in cfg.heads)
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.hook_embed = HookPoint()  # [batch, pos, d_model]
        self.setup()

    @property
    def n_heads(self) -> list[int]:
        return self.cfg.heads

    def forward(self, ids: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos vocab"]:
        return self.lm_head(self.final_residual(ids))

    def logits_at(
        self, ids: Int[Tensor, "batch pos"], positions: Int[Tensor, " P"], columns: slice
    ) -> Float[Tensor, "batch P C"]:
        """``forward(ids)[:, positions, columns]``: ``lm_head``'s rows ``columns`` at those positions only."""
        resid = self.final_residual(ids)[:, positions.to(self.lm_head.weight.device)]
        return resid @ self.lm_head.weight[columns].T

    def final_residual(self, ids: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        """What ``lm_head`` reads: every block, then ``ln_f``."""
        if ids.shape[-1] > self.cfg.block_size:
            raise ValueError(f"a sequence of {ids.shape[-1]} tokens exceeds block_size={self.cfg.block_size}")
        x = self.hook_embed(self.wte(ids))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)


def their_key(key: str) -> str:
    """Our parameter name -> theirs (``blocks.0.attn.Q.weight`` -> ``layers.0.Q.weight``)."""
    return key.replace("blocks.", "layers.", 1).replace(".attn.", ".", 1) if key.startswith("blocks.") else key
