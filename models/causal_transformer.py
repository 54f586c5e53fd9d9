"""The two-layer disentangled transformer of Wei et al. (ICLR 2026), PAPER.md section 3, with hooks.

Read top to bottom: the config, the copyer layer (``blocks.0``, the paper's layer 1), the bilinear
parent-selecting head (``blocks.1``, the paper's layer 2), and the model that strings them together.

Residual stream. Layer 1 reads the one-hot tokens of the whole flat context (width d). It is
evaluated only at the H target positions, the rows that feed a prediction; there it writes a
disentangled residual of width (K+1)d: subspace 0 holds the target token x_h, subspace k+1 the copy
u_h^k written by copyer head k. Layer 2 reads that residual at the H target positions.

No leak. The prediction at target position h is the distribution of x_h itself, so nothing at h may
see x_h: copyer rows attend to every demonstration token but only to target tokens h' < h, and the
layer-2 query at h has its token subspace zeroed (it sees only the copies v_h = [u_h^1..u_h^K]).
Keys and values at h' < h see the whole residual, target token included.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import einops
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformer_lens import ActivationCache, HookedRootModule
from transformer_lens.hook_points import HookPoint

from probes.bma import check_tokens

DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass
class CausalTransformerConfig:
    d_vocab: int  # d, vocabulary size (tokens are one-hot)
    n_examples: int  # L, demonstrations per context
    seq_len: int  # H, tokens per sequence
    n_copy_heads: int | None = None  # K, copyer heads in blocks.0; None means K = L
    dtype: str = "float32"
    device: str = "cpu"
    # As in TransformerLens: compute blocks.0.attn.hook_result, the per-head contributions in residual
    # space. Off by default: they are K(K+1)d numbers a position (2.5 GB for a batch of 256 at L=K=64).
    use_attn_result: bool = False

    def __post_init__(self):
        if self.n_copy_heads is None:
            self.n_copy_heads = self.n_examples
        for name in ("d_vocab", "n_examples", "seq_len", "n_copy_heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"config field {name} must be a positive integer, got {value!r}")
        if self.d_vocab < 2 or self.seq_len < 2:
            raise ValueError(f"need d_vocab >= 2 and seq_len >= 2, got {self.d_vocab} and {self.seq_len}")
        if not isinstance(self.use_attn_result, bool):
            raise ValueError(f"use_attn_result must be true or false, got {self.use_attn_result!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")

    # TransformerLens reads these names (patching, ActivationCache).
    n_layers = 2
    n_key_value_heads = None

    @property
    def n_heads(self) -> int:
        """Heads of blocks.0 (blocks.1 has one; pass an explicit index_df to patching)."""
        return self.n_copy_heads

    @property
    def d_model(self) -> int:
        """Width of the disentangled residual, (K+1) d."""
        return (self.n_copy_heads + 1) * self.d_vocab

    @property
    def n_tokens(self) -> int:
        """Length of a flat context, (L+1) H."""
        return (self.n_examples + 1) * self.seq_len

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> CausalTransformerConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown config fields {sorted(unknown)}; expected a subset of {sorted(known)}")
        return cls(**d)


RESULT_HOOK = "blocks.0.attn.hook_result"


def _hooked_result(hook: HookPoint, per_head: Float[Tensor, "batch pos head d"], cfg) -> Tensor | None:
    """Per-head contributions in residual space, ``[batch, pos, head, d_model]``, when
    ``cfg.use_attn_result``; None otherwise. A hook attached while it is off is an error, not a no-op."""
    if not cfg.use_attn_result:
        if hook.fwd_hooks:
            raise ValueError(f"{RESULT_HOOK} is off: set model.cfg.use_attn_result = True to hook per-head results")
        return None
    d_model = cfg.d_model
    b, p, k, d = per_head.shape
    result = per_head.new_zeros(b, p, k, d_model // d, d)
    heads = torch.arange(k, device=per_head.device)
    result[:, :, heads, heads + 1] = per_head  # head i writes subspace i+1; subspace 0 is the token
    return hook(result.flatten(3))


def _unbroadcast(t: Tensor, broadcast: Tensor | None, base: Tensor | None) -> Tensor | None:
    """The ``[K, H, T]`` tensor behind a batch-broadcast (stride-0) ``t``, or None if ``t`` differs per
    context. ``base`` itself when ``t`` is still ``broadcast = base.expand(...)`` (no hook replaced it):
    indexing ``t[0]`` instead would make autograd allocate a zero ``[batch, K, H, T]`` gradient."""
    if t.stride(0) != 0:
        return None
    return base if t is broadcast else t[0]


def _without_result(names_filter):
    """A TransformerLens ``names_filter`` (None, str, list or callable) that also drops RESULT_HOOK."""
    if names_filter is None:
        return lambda name: name != RESULT_HOOK
    if isinstance(names_filter, str):
        names_filter = [names_filter]
    if callable(names_filter):
        return lambda name: name != RESULT_HOOK and names_filter(name)
    return [name for name in names_filter if name != RESULT_HOOK]


class CopyerAttention(nn.Module):
    """K content-free relative-position heads. Score from target row h to key (example l, position h'):
    ``w_H[k, h' - h + H - 1] + w_L[k, l]``; target keys h' >= h are masked."""

    def __init__(self, cfg: CausalTransformerConfig):
        super().__init__()
        self.cfg = cfg
        K, L, H = cfg.n_copy_heads, cfg.n_examples, cfg.seq_len
        kw = {"dtype": cfg.torch_dtype, "device": cfg.device}
        self.w_H = nn.Parameter(torch.zeros(K, 2 * H - 1, **kw))  # inner-example offset h' - h
        # w_L[k, l] for demonstration l < L (the paper's w^L); w_L[k, L] for the target's own prefix.
        self.w_L = nn.Parameter(torch.zeros(K, L + 1, **kw))
        self.hook_attn_scores = HookPoint()  # [batch, K, H, (L+1)H]
        self.hook_pattern = HookPoint()  # [batch, K, H, (L+1)H]
        self.hook_z = HookPoint()  # [batch, H, K, d]: the copies u_h^k
        self.hook_result = HookPoint()  # [batch, H, K, (K+1)d]: head k's copy placed in subspace k+1
        offsets = torch.arange(H).view(1, H) - torch.arange(H).view(H, 1)  # [h, h'] -> h' - h
        self.register_buffer("offset_index", offsets + H - 1, persistent=False)
        future = torch.ones(H, H, dtype=torch.bool).triu()  # target key h' >= h
        self.register_buffer("future_mask", future, persistent=False)

    def scores(self) -> Float[Tensor, "K H T"]:
        """The (batch-independent) copyer scores; -inf on target keys h' >= h."""
        K, L, H = self.cfg.n_copy_heads, self.cfg.n_examples, self.cfg.seq_len
        s = self.w_H[:, self.offset_index].unsqueeze(2) + self.w_L.view(K, 1, L + 1, 1)  # [K, h, l, h']
        s = s.clone()
        s[:, :, L] = s[:, :, L].masked_fill(self.future_mask, float("-inf"))
        return s.reshape(K, H, (L + 1) * H)

    def forward(self, x: Float[Tensor, "batch T d"]) -> tuple[Float[Tensor, "batch H K d"], Tensor | None]:
        """Copies u_h^k and (if hooked) the per-head results."""
        batch = x.shape[0]
        # Scores and pattern are content-free: computed once and broadcast over the batch (stride 0),
        # so caching them costs no memory. A hook that returns a per-context tensor is honoured.
        base = self.scores()
        broadcast = base.expand(batch, -1, -1, -1)
        scores = self.hook_attn_scores(broadcast)
        shared = _unbroadcast(scores, broadcast, base)
        if shared is None:
            pattern, broadcast = scores.softmax(-1), None
        else:
            shared = shared.softmax(-1)
            pattern = broadcast = shared.expand_as(scores)
        pattern = self.hook_pattern(pattern)
        shared = _unbroadcast(pattern, broadcast, shared)
        if shared is not None:
            z = torch.einsum("khT,bTd->bhkd", shared, x)
        else:
            z = torch.einsum("bkhT,bTd->bhkd", pattern, x)
        z = self.hook_z(z)
        return z, _hooked_result(self.hook_result, z, self.cfg)


class BilinearAttention(nn.Module):
    """One head: score ``k_h'^T W_KQ q_h`` over keys h' < h; the output is the attention-weighted
    mixture of the value distributions ``softmax(z_h' W_OV)``."""

    def __init__(self, cfg: CausalTransformerConfig):
        super().__init__()
        self.cfg = cfg
        D, d, H = cfg.d_model, cfg.d_vocab, cfg.seq_len
        kw = {"dtype": cfg.torch_dtype, "device": cfg.device}
        self.W_KQ = nn.Parameter(torch.zeros(D, D, **kw))  # rows: key subspaces, columns: query subspaces
        self.W_OV = nn.Parameter(torch.zeros(D, d, **kw))  # residual -> logits of the value distribution
        self.hook_q = HookPoint()  # [batch, H, 1, (K+1)d]: query-side input (token subspace zeroed)
        self.hook_k = HookPoint()  # [batch, H, 1, (K+1)d]: key-side input
        self.hook_v = HookPoint()  # [batch, H, 1, d]: log-probabilities of each key's value distribution
        self.hook_attn_scores = HookPoint()  # [batch, 1, H, H]: -inf on h' >= h
        self.hook_pattern = HookPoint()  # [batch, 1, H, H]: row 0 (no candidate parent) all zeros
        self.hook_z = HookPoint()  # [batch, H, 1, d]: the mixture distribution (row 0 zeros)
        self.hook_result = HookPoint()  # [batch, H, 1, d]: the head's output (= hook_z, one head)
        self.register_buffer("future_mask", torch.ones(H, H, dtype=torch.bool).triu(), persistent=False)
        query_mask = torch.ones(D, dtype=cfg.torch_dtype)
        query_mask[:d] = 0
        self.register_buffer("query_mask", query_mask, persistent=False)

    def attention(self, resid: Float[Tensor, "batch H D"]) -> Float[Tensor, "batch 1 H H"]:
        """The hooked pattern over keys h' < h (shared with the continuous variant, models.continuous)."""
        q = self.hook_q((resid * self.query_mask).unsqueeze(2))
        k = self.hook_k(resid.unsqueeze(2))
        scores = einops.einsum(k, self.W_KQ, q, "b key n D, D E, b query n E -> b n query key")
        scores = self.hook_attn_scores(scores.masked_fill(self.future_mask, float("-inf")))
        # Row 0 has no candidates: its softmax would be 0/0, so it is set to zeros explicitly.
        pattern = torch.cat([torch.zeros_like(scores[:, :, :1]), scores[:, :, 1:].softmax(-1)], dim=2)
        return self.hook_pattern(pattern)

    def forward(self, resid: Float[Tensor, "batch H D"]) -> Float[Tensor, "batch H 1 d"]:
        pattern = self.attention(resid)
        v = self.hook_v((resid @ self.W_OV).log_softmax(-1).unsqueeze(2))
        z = self.hook_z(einops.einsum(pattern, v.exp(), "b n query key, b key n d -> b query n d"))
        return self.hook_result(z)


class Block(nn.Module):
    """A layer with the TransformerLens residual hooks around its attention."""

    def __init__(self, attn: nn.Module):
        super().__init__()
        self.hook_resid_pre = HookPoint()
        self.attn = attn
        self.hook_resid_post = HookPoint()


class CausalTransformer(HookedRootModule):
    """``model(tokens)`` -> log-probabilities ``[batch, H, d]`` of the target tokens x_h given the
    demonstrations and x_{<h}; row 0 is the model's prior for the root. See the module docstring."""

    select_attention = BilinearAttention  # blocks.1 (models.continuous swaps in a mean-valued head)

    def __init__(self, cfg: CausalTransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.hook_embed = HookPoint()  # [batch, (L+1)H, d]: one-hot tokens
        self.blocks = nn.ModuleList([Block(CopyerAttention(cfg)), Block(self.select_attention(cfg))])
        # blocks.0.hook_resid_pre [batch, (L+1)H, d]; blocks.0.hook_resid_post and blocks.1.hook_resid_pre
        # [batch, H, (K+1)d]; blocks.1.hook_resid_post [batch, H, d] (the head's mixture).
        self.b_root = nn.Parameter(torch.zeros(cfg.d_vocab, dtype=cfg.torch_dtype, device=cfg.device))
        self.hook_log_probs = HookPoint()  # [batch, H, d]: the output
        self.setup()

    def forward(self, tokens: Int[Tensor, "batch T"]) -> Float[Tensor, "batch H d"]:
        cfg = self.cfg
        tokens = check_tokens(tokens, cfg.d_vocab, cfg.n_examples, cfg.seq_len)
        tokens = tokens.to(self.b_root.device, non_blocking=tokens.is_pinned())  # pinned: an async copy
        x = self.hook_embed(F.one_hot(tokens, cfg.d_vocab).to(cfg.torch_dtype))
        mixture = self.layers(x)
        log_probs = torch.cat([self.b_root.log_softmax(-1).expand(len(tokens), 1, -1), mixture[:, 1:].log()], 1)
        return self.hook_log_probs(log_probs)

    def layers(self, x: Float[Tensor, "batch T d"]) -> Float[Tensor, "batch H d"]:
        """blocks.0, the disentangled residual and blocks.1, from the embedded context to the head's output."""
        cfg = self.cfg
        copy_block, select_block = self.blocks
        x = copy_block.hook_resid_pre(x)
        u, result = copy_block.attn(x)
        target = x[:, -cfg.seq_len :]  # the target sequence's own tokens: subspace 0
        if result is None:
            resid = torch.cat([target, u.flatten(2)], dim=-1)
        else:  # same numbers, through the hooked per-head results (adding exact zeros)
            resid = F.pad(target, (0, cfg.d_model - cfg.d_vocab)) + result.sum(2)
        resid = copy_block.hook_resid_post(resid)
        mixture = select_block.attn(select_block.hook_resid_pre(resid))
        return select_block.hook_resid_post(mixture.squeeze(2))

    def run_with_cache(self, *args, **kwargs) -> tuple[Float[Tensor, "batch H d"], ActivationCache]:
        """As ``HookedRootModule.run_with_cache``, with the cache wrapped in an ``ActivationCache``.
        ``blocks.0.attn.hook_result`` is cached only when ``cfg.use_attn_result`` is on."""
        if not self.cfg.use_attn_result:
            kwargs["names_filter"] = _without_result(kwargs.get("names_filter"))
        out, cache = super().run_with_cache(*args, **kwargs)
        return out, cache if isinstance(cache, ActivationCache) else ActivationCache(cache, self)

    # Readable views of the mechanism ------------------------------------------------------------
    def copyer_pattern(self) -> Float[Tensor, "K H T"]:
        """The blocks.0 attention pattern (the same for every context)."""
        return self.blocks[0].attn.scores().softmax(-1)

    @property
    def W_KQ(self) -> Float[Tensor, "D D"]:
        return self.blocks[1].attn.W_KQ

    @property
    def W_OV(self) -> Float[Tensor, "D d"]:
        return self.blocks[1].attn.W_OV
