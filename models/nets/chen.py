"""Chen et al.'s two-layer transformer (``gszfwsb/Unveiling-Induction-Heads``, ``RPE/model.py``'s
``TwoLayerTransformer``: ``RPEAttention`` then ``PolyKernelMultiHeadAttention``; no licence, so written here
from its equations, not copied) as a ``transformer_lens.HookedRootModule`` with their parameter names.

Their forward reads T one-hot tokens ``X`` and predicts token T from an appended zero row. Its equations
hold for any prefix, so ours predicts every position at once: position p predicts token p + 1 from the zero
row that would follow tokens 0..p (on all T tokens, its last row is their output)::

    layer 1, head h < H: positional bias b_h(0) = 1e-6, b_h(k) = W[k-1, h] for h < k <= h + H, else -inf
      key rows s:   A_h[s, r] = softmax_r(x_s QK_h x_r + b_h(s - r))           blocks.0.attn.hook_key_pattern
                    z[s, h] = sum_r A_h[s, r] x_r                              blocks.0.attn.hook_z [batch, pos, head, d]
                    u_h[s] = LayerNorm(z[s, h] @ o_v_proj[:, :, h])            [batch, pos, d]
      query row p:  the zero row at p + 1: its content score is 0, so its pattern is positional only,
                    P_h[p, r] = softmax over r <= p + 1 of b_h(p + 1 - r)     blocks.0.attn.hook_pattern (r <= p)
                    v_h[p] = LayerNorm((sum_{r<=p} P_h[p, r] x_r) @ o_v_proj[:, :, h])    hook_query_z holds the sum
      (QK_h = q_proj[:, :, h] @ k_proj[:, :, h].T; one LayerNorm shared by the heads)
    layer 2 (the FFN that selects parents, folded into the attention scores; components c = 0..H):
      key s = [x_s, u_0[s], ..., u_{H-1}[s]], query p = [0, v_0[p], ..., v_{H-1}[p]]
      e_c = relu(<query_c, key_c>),  f_alpha = prod_c (e_c + 1e-24)^alpha_c  for each kept alpha in {0,1}^(H+1)
      score[p, s] = a * sum_alpha C_alpha^2 f_alpha / sum_{alpha: alpha_0 = 0} C_alpha^2   blocks.1.attn.hook_attn_scores
      out[p] = sum_{s <= p} softmax_s(score[p, s]) x_s      blocks.1.attn.hook_pattern [batch, 1, q, k], hook_z
    logits = out  [batch, pos, d]: a probability vector, which their criterion (cross-entropy) reads as logits

The kept alphas are those with |alpha| <= low_degree (all when low_degree is -1), in ``itertools.product``
order, as their ``degrees``.

Their ``SimplifiedTwoLayerTransformer`` (``RPE/model.py``, trained by ``RPE/train_simplified.py``, which their
``jobs/3-gram.sh`` runs; ``ChenConfig.simplified``) has the same layer 2 and a first layer of positions only
(``SimplifiedRPEAttention``): no content score, no self score (b_h(0) = -inf, so a row with no key in its
window, s <= h, is all -inf: its softmax's NaN is their ``nan_to_num`` 0), no ``o_v_proj``, and instead of the
LayerNorm their ``SimplifiedLayerNorm``, z / (||z|| + 1e-7)::

    key rows s:   A_h[s, r] = softmax_r(b_h(s - r)),  u_h[s] = n(sum_r A_h[s, r] x_r)
    query row p:  P_h[p, r] = softmax over r <= p of b_h(p + 1 - r),  v_h[p] = n(sum_r P_h[p, r] x_r)
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
class ChenConfig:
    """What their ``TwoLayerTransformer(vocab_size, seq_length, num_heads, ..., low_degree)`` fixes."""

    d_vocab: int  # their S (vocab_size)
    n_ctx: int  # their T (seq_length): the rows of W
    n_heads: int  # their H
    low_degree: int = -1
    device: str = "cpu"
    n_layers: int = 2
    simplified: bool = False  # their SimplifiedTwoLayerTransformer (module docstring)


def all_degrees(n_heads: int) -> Tensor:
    """Their ``mydegree``: every alpha in {0,1}^(H+1), ``itertools.product`` order (row i: the bits of i, the
    first component the most significant). [2^(H+1), H+1]"""
    bits = torch.arange(n_heads, -1, -1)
    return ((torch.arange(2 ** (n_heads + 1)).unsqueeze(1) >> bits) & 1).float()


def n_kept(n_heads: int, low_degree: int) -> int:
    """How many alphas ``kept`` keeps, counted without building them: sum over k <= low_degree of C(H+1, k)."""
    return 2 ** (n_heads + 1) if low_degree == -1 else sum(math.comb(n_heads + 1, k) for k in range(low_degree + 1))


def kept(n_heads: int, low_degree: int) -> Tensor:
    """The alphas their ``degrees`` keeps: |alpha| <= low_degree, or all when it is -1. [n_kept, H+1]"""
    d = all_degrees(n_heads)
    return d if low_degree == -1 else d[d.sum(1) <= low_degree]


class RelativePositions(nn.Module):
    """What both first layers share: W [T, H], the positional bias b_h and the hooks of layer 1."""

    SELF_SCORE = 1e-6  # b_h(0), the score of a row on itself (their TwoLayerTransformer's diagonal fill)

    def __init__(self, cfg: ChenConfig):
        super().__init__()
        T, H = cfg.n_ctx, cfg.n_heads
        if 2 * H - 1 > T:
            raise ValueError(f"n_heads={H} needs seq_length >= {2 * H - 1} (their W has T rows), got {T}")
        self.W = nn.Parameter(torch.zeros(T, H))
        self.H = H
        self.hook_key_pattern = HookPoint()  # [batch, head, pos, pos]
        self.hook_z = HookPoint()  # [batch, pos, head, d_vocab]
        self.hook_pattern = HookPoint()  # [batch, head, pos, pos]
        self.hook_query_z = HookPoint()  # [batch, pos, head, d_vocab]

    def bias(self, n: int) -> Float[Tensor, "head n n"]:
        """b_h(i - j) for rows and columns 0..n-1 (their W_h)."""
        k = torch.arange(n).view(-1, 1) - torch.arange(n).view(1, -1)
        h = torch.arange(self.H).view(-1, 1, 1)
        window = (k > h) & (k <= h + self.H)
        w = self.W[(k - 1).clamp(0, self.W.shape[0] - 1).expand(self.H, n, n), h.expand(self.H, n, n)]
        out = torch.where(window, w, torch.full_like(w, float("-inf")))
        return torch.where(k == 0, torch.full_like(out, self.SELF_SCORE), out)


class ChenSimplifiedLayer1(RelativePositions):
    """Their ``SimplifiedRPEAttention`` (module docstring): positions only, no self score, z / (||z|| + 1e-7)."""

    SELF_SCORE = float("-inf")

    def forward(self, x: Float[Tensor, "batch pos d"]) -> tuple[Tensor, Tensor]:
        """(key copies u [batch, pos, head, d], query copies v [batch, pos, head, d])."""
        B, T, _ = x.shape
        bias = self.bias(T + 1).to(x)
        key, query = (bias[:, rows, :T].softmax(-1).nan_to_num(0.0) for rows in (slice(0, T), slice(1, T + 1)))
        z = self.hook_z(torch.einsum("bhsr,brd->bshd", self.hook_key_pattern(key.expand(B, -1, -1, -1)), x))
        zq = self.hook_query_z(torch.einsum("bhpr,brd->bphd", self.hook_pattern(query.expand(B, -1, -1, -1)), x))
        return tuple(t / (t.norm(dim=-1, keepdim=True) + 1e-7) for t in (z, zq))


class ChenLayer1(RelativePositions):
    def __init__(self, cfg: ChenConfig):
        super().__init__(cfg)
        d, H = cfg.d_vocab, cfg.n_heads
        self.q_proj, self.k_proj, self.o_v_proj = (nn.Parameter(torch.zeros(d, d, H)) for _ in range(3))
        self.norm = nn.LayerNorm(d)

    def forward(self, x: Float[Tensor, "batch pos d"]) -> tuple[Tensor, Tensor]:
        """(key copies u [batch, pos, head, d], query copies v [batch, pos, head, d])."""
        B, T, d = x.shape
        bias = self.bias(T + 1).to(x)
        qk = torch.einsum("ijh,kjh->hik", self.q_proj, self.k_proj)
        scores = torch.einsum("bsi,hik,brk->bhsr", x, qk, x) + bias[:, :T, :T]
        z = self.hook_z(torch.einsum("bhsr,brd->bshd", self.hook_key_pattern(scores.softmax(-1)), x))
        zero_row = torch.eye(T + 1, dtype=torch.bool, device=x.device)[1:]  # row p's own (zero) row, at p + 1
        query = bias[:, 1:, :].softmax(-1).masked_fill(zero_row, 0)[..., :T]  # its weight times 0 is dropped
        pattern = self.hook_pattern(query.expand(B, -1, -1, -1))
        zq = self.hook_query_z(torch.einsum("bhpr,brd->bphd", pattern, x))
        return tuple(self.norm(torch.einsum("bphd,deh->bphe", t, self.o_v_proj)) for t in (z, zq))


class ChenLayer2(nn.Module):
    def __init__(self, cfg: ChenConfig):
        super().__init__()
        self.register_buffer("mydegree", all_degrees(cfg.n_heads))  # theirs: in the state dict, all 2^(H+1)
        self.register_buffer("degrees", kept(cfg.n_heads, cfg.low_degree), persistent=False)
        self.C_alpha_list = nn.Parameter(torch.ones(1, len(self.degrees)))
        self.a = nn.Parameter(torch.ones(1))
        self.hook_attn_scores = HookPoint()  # [batch, 1, q, k]
        self.hook_pattern = HookPoint()  # [batch, 1, q, k]
        self.hook_z = HookPoint()  # [batch, pos, 1, d_vocab]

    def forward(self, x, u, v) -> Float[Tensor, "batch pos d"]:
        """x one-hot [batch, pos, d]; u, v the key and query copies [batch, pos, head, d]."""
        T = x.shape[1]
        e = F.relu(torch.einsum("bphd,bshd->bpsh", v, u))
        e = torch.cat([torch.zeros_like(e[..., :1]), e], -1)  # component 0: <0, x_s>
        f = torch.exp(torch.einsum("bpsc,lc->bpsl", torch.log(e + 1e-24), self.degrees))
        c2 = self.C_alpha_list[0] ** 2
        scores = self.a * (f @ c2) / c2[self.degrees[:, 0] == 0].sum()
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        scores = self.hook_attn_scores(scores.masked_fill(~causal, float("-inf")).unsqueeze(1))
        pattern = self.hook_pattern(scores.softmax(-1))
        return self.hook_z((pattern[:, 0] @ x).unsqueeze(2))[:, :, 0]


class Block(nn.Module):
    """Holds a layer under ``attn``, for the TransformerLens hook names ``blocks.{i}.attn.*``."""

    def __init__(self, attn: nn.Module):
        super().__init__()
        self.attn = attn


class ChenTransformer(HookedRootModule):
    """The model of the module docstring; ``forward(ids [batch, pos]) -> logits [batch, pos, vocab]``."""

    def __init__(self, cfg: ChenConfig):
        super().__init__()
        self.cfg = cfg
        layer1 = ChenSimplifiedLayer1(cfg) if cfg.simplified else ChenLayer1(cfg)
        self.blocks = nn.ModuleList([Block(layer1), Block(ChenLayer2(cfg))])
        self.hook_embed = HookPoint()  # [batch, pos, d_vocab]: the one-hot tokens
        self.setup()

    @property
    def n_heads(self) -> list[int]:
        return [self.cfg.n_heads, 1]

    def forward(self, ids: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos vocab"]:
        if ids.shape[-1] > self.cfg.n_ctx:
            raise ValueError(f"a sequence of {ids.shape[-1]} tokens exceeds seq_length={self.cfg.n_ctx}")
        x = self.hook_embed(F.one_hot(ids, self.cfg.d_vocab).to(self.blocks[0].attn.W.dtype))
        u, v = self.blocks[0].attn(x)
        return self.blocks[1].attn(x, u, v)


def their_key(key: str) -> str:
    """Our parameter name -> theirs (``blocks.0.attn.W`` -> ``layer1.W``)."""
    return key.replace("blocks.0.attn.", "layer1.", 1).replace("blocks.1.attn.", "layer2.", 1)
