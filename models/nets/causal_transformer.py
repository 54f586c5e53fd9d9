"""The two-layer disentangled transformer of Wei et al. (ICLR 2026), docs/paper.md section 3, with hooks.

Read top to bottom: the config, the copyer layer (``blocks.0``, the paper's layer 1), the bilinear
parent-selecting head (``blocks.1``, the paper's layer 2) and the model that strings them together. Its
TransformerLens face (the hook API made to fit it, the shared copyer pattern, its ``ActivationCache``,
``CausalCache``) is ``models.nets.tl_adapter``; docs/reference/transformerlens.md says which idioms work and
what to use for those that do not apply.

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
from transformer_lens import ActivationCache
from transformer_lens.hook_points import HookPoint

from models.nets.dtypes import DTYPES, dtype_name, torch_dtype
from models.nets.tl_adapter import RESULT_HOOK, CausalCache, HookedAdapter, as_shared, place_copies
from probes.bma import check_tokens

RETURN_TYPES = ("log_probs", "loss", None)


@dataclass
class CausalTransformerConfig:
    d_vocab: int  # d, vocabulary size (tokens are one-hot)
    n_examples: int  # L, demonstrations per context (0: the target alone; then K must be given)
    seq_len: int  # H, tokens per sequence
    n_copy_heads: int | None = None  # K, copyer heads in blocks.0; None means K = L
    dtype: str = "float32"
    device: str = "cpu"
    # As in TransformerLens: compute blocks.0.attn.hook_result, the per-head contributions in residual
    # space. Off by default: they are K(K+1)d numbers a position (2.5 GB for a batch of 256 at L=K=64).
    use_attn_result: bool = False

    def __post_init__(self):
        if self.n_copy_heads is None and self.n_examples == 0:
            raise ValueError("config field n_copy_heads must be given when n_examples = 0 (the default is K = L)")
        if self.n_copy_heads is None:
            self.n_copy_heads = self.n_examples
        for name in ("d_vocab", "n_examples", "seq_len", "n_copy_heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < (name != "n_examples"):
                kind = "a non-negative" if name == "n_examples" else "a positive"
                raise ValueError(f"config field {name} must be {kind} integer, got {value!r}")
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
        return torch_dtype(self.dtype)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> CausalTransformerConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown config fields {sorted(unknown)}; expected a subset of {sorted(known)}")
        return cls(**d)


def _hooked_result(hook: HookPoint, per_head: Float[Tensor, "batch pos head d"], cfg) -> Tensor | None:
    """Per-head contributions in residual space, ``[batch, pos, head, d_model]``, when
    ``cfg.use_attn_result``; None otherwise. A hook attached while it is off is an error, not a no-op."""
    if not cfg.use_attn_result:
        if hook.fwd_hooks:
            raise ValueError(f"{RESULT_HOOK} is off: set model.cfg.use_attn_result = True to hook per-head results")
        return None
    return hook(place_copies(per_head, cfg.d_model))


def _unbroadcast(t: Tensor, broadcast: Tensor | None, base: Tensor | None) -> Tensor | None:
    """The ``[K, H, T]`` tensor behind a batch-broadcast (stride-0) ``t``, or None if ``t`` differs per
    context. ``base`` itself when ``t`` is still ``broadcast = base.expand(...)`` (no hook replaced it):
    indexing ``t[0]`` instead would make autograd allocate a zero ``[batch, K, H, T]`` gradient."""
    if t.stride(0) != 0:
        return None
    return base if t is broadcast else t[0]


FACTOR_ABOVE = 4  # CopyerAttention.factored: the work ratio above which the copies are computed factored


class CopyerAttention(nn.Module):
    """K content-free relative-position heads. Score from target row h to key (example l, position h'):
    ``w_H[k, h' - h + H - 1] + w_L[k, l]``; target keys h' >= h are masked. With no demonstrations
    (L = 0) row 0 has no key: its score on key 0 is left finite and its pattern row is zero (no copy)."""

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
        future[0, 0] = L > 0  # L = 0: a finite score in the keyless row 0, whose pattern is then zeroed
        self.register_buffer("future_mask", future, persistent=False)
        self.register_buffer("keyed_rows", (torch.arange(H) > 0).view(H, 1).to(**kw), persistent=False)
        # The copies through factored_copies where that saves over FACTOR_ABOVE times the dense work
        # (medium 10x, large 16x; never at L = 0); the default size keeps the dense contraction, bit for bit.
        self.factored = (L + 1) * H > FACTOR_ABOVE * (L + 2 * H)

    def softmax(self, scores: Float[Tensor, "... H T"]) -> Float[Tensor, "... H T"]:
        """The pattern from the scores; with L = 0 the keyless row 0 is zero."""
        pattern = scores.softmax(-1)
        return pattern if self.cfg.n_examples else pattern * self.keyed_rows

    def scores(self) -> Float[Tensor, "K H T"]:
        """The (batch-independent) copyer scores; -inf on target keys h' >= h."""
        K, L, H = self.cfg.n_copy_heads, self.cfg.n_examples, self.cfg.seq_len
        s = self.w_H[:, self.offset_index].unsqueeze(2) + self.w_L.view(K, 1, L + 1, 1)  # [K, h, l, h']
        s = s.clone()
        s[:, :, L] = s[:, :, L].masked_fill(self.future_mask, float("-inf"))
        return s.reshape(K, H, (L + 1) * H)

    def factored_copies(self, x: Float[Tensor, "batch T d"]) -> Float[Tensor, "batch H K d"]:
        """``softmax(scores()) @ x`` without forming the [K, H, (L+1)H] pattern. A score is a sum
        ``w_L[k, l] + w_H[k, h' - h + H - 1]``, so the pattern is a product ``e_L[k, l] e_H[k, h, h'] / Z[k, h]``:
        the copy sums over l first (a [K, L] map), then over h' (a [K, H, H] one), (L + 2H) / ((L+1)H) of the
        dense contraction's work (a sixteenth at L = K = 64, H = 32). A view, not contiguous."""
        K, L, H = self.cfg.n_copy_heads, self.cfg.n_examples, self.cfg.seq_len
        batch, d = x.shape[0], x.shape[-1]
        w_H = self.w_H[:, self.offset_index]  # [K, h, h']
        e_H = (w_H - w_H.amax(-1, keepdim=True)).exp()  # each row's largest is 1 (every offset is a demonstration's)
        e_L = (self.w_L - self.w_L.amax(-1, keepdim=True)).exp()  # [K, L+1]
        e_T = e_H.masked_fill(self.future_mask, 0) * e_L[:, L, None, None]  # the target's keys: h' < h only
        Z = (e_L[:, :L].sum(-1, keepdim=True) * e_H.sum(-1) + e_T.sum(-1)).unsqueeze(-1)  # [K, H, 1]
        xs = x.unflatten(1, (L + 1, H)).permute(1, 2, 0, 3).reshape(L + 1, H, batch * d)  # [l, h', (batch d)]
        demos = (e_L[:, :L] @ xs[:L].flatten(1)).view(K, H, batch * d)  # sum over l: [K, h', (batch d)]
        target = ((e_T / Z).flatten(0, 1) @ xs[L]).view(K, H, batch * d)  # [K, h, (batch d)]
        z = torch.baddbmm(target, e_H / Z, demos)  # + sum over h' of the demonstrations
        return z.view(K, H, batch, d).permute(2, 1, 0, 3)

    def forward(self, x: Float[Tensor, "batch T d"]) -> tuple[Float[Tensor, "batch H K d"], Tensor | None]:
        """Copies u_h^k and (if hooked) the per-head results."""
        batch = x.shape[0]
        hooked = any(h.fwd_hooks or h.bwd_hooks for h in (self.hook_attn_scores, self.hook_pattern))
        if self.factored and not hooked:  # the output only: no pattern is formed
            z = self.hook_z(self.factored_copies(x))
            return z, _hooked_result(self.hook_result, z, self.cfg)
        # Scores and pattern are content-free: computed once and broadcast over the batch (stride 0),
        # so caching them costs no memory. A hook that returns a per-context tensor is honoured.
        base = self.scores()
        broadcast = as_shared(base.expand(batch, -1, -1, -1), self.hook_attn_scores)
        scores = self.hook_attn_scores(broadcast)
        untouched = scores is broadcast  # no hook replaced the scores
        shared = _unbroadcast(scores, broadcast, base)
        if shared is None:
            pattern, broadcast = self.softmax(scores), None
        else:
            shared = self.softmax(shared)
            pattern = broadcast = as_shared(shared.expand_as(scores), self.hook_pattern)
        pattern = self.hook_pattern(pattern)
        untouched = self.factored and untouched and pattern is broadcast
        shared = _unbroadcast(pattern, broadcast, shared)
        if shared is not None:
            z = torch.einsum("khT,bTd->bhkd", shared, x)
        else:
            z = torch.einsum("bkhT,bTd->bhkd", pattern, x)
        if untouched:  # hooks read, changed nothing: the unhooked numbers, gradients through the pattern
            z = self.factored_copies(x).detach() + (z - z.detach())
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
        """The hooked pattern over keys h' < h (shared with the continuous variant, models.nets.continuous)."""
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


class CausalTransformer(HookedAdapter):
    """``model(tokens)`` -> log-probabilities ``[batch, H, d]`` of the target tokens x_h given the
    demonstrations and x_{<h}; row 0 is the model's prior for the root. See the module docstring."""

    select_attention = BilinearAttention  # blocks.1 (models.nets.continuous swaps in a mean-valued head)

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

    def forward(self, tokens: Int[Tensor, "batch T"], return_type: str | None = "log_probs") -> Tensor | None:
        """``return_type`` as in TransformerLens: "log_probs" (default) ``[batch, H, d]``; "loss", the mean
        NLL of the target tokens x_1..x_{H-1} (as ``probes.target_nll``; row 0 is the root prior); None."""
        if return_type not in RETURN_TYPES:
            raise ValueError(f"return_type must be one of {list(RETURN_TYPES)}, got {return_type!r}")
        cfg = self.cfg
        tokens = check_tokens(tokens, cfg.d_vocab, cfg.n_examples, cfg.seq_len)
        tokens = tokens.to(self.b_root.device, non_blocking=tokens.is_pinned())  # pinned: an async copy
        x = self.hook_embed(F.one_hot(tokens, cfg.d_vocab).to(self.b_root.dtype))
        mixture = self.layers(x)
        log_probs = torch.cat([self.b_root.log_softmax(-1).expand(len(tokens), 1, -1), mixture[:, 1:].log()], 1)
        log_probs = self.hook_log_probs(log_probs)
        if return_type == "loss":
            target = tokens[:, -cfg.seq_len :, None]
            return -log_probs.gather(-1, target)[:, 1:].mean()
        return log_probs if return_type == "log_probs" else None

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

    def _apply(self, fn, recurse: bool = True):
        """``.to(dtype / device)``, ``.double()``, ``.half()``, ``.cuda()``... keep ``cfg.dtype`` and
        ``cfg.device`` true (the forward follows the parameters' dtype and device)."""
        super()._apply(fn, recurse)
        dtype = self.b_root.dtype
        name = dtype_name(dtype)
        if name is None:
            raise ValueError(f"the model does not run in {dtype}; convert it to one of {sorted(DTYPES)}")
        self.cfg.dtype, self.cfg.device = name, str(self.b_root.device)
        return self

    def decompose_resid(self, cache: ActivationCache) -> tuple[Float[Tensor, "piece batch H D"], list[str]]:
        """The disentangled residual ``blocks.0.hook_resid_post`` as its K+1 pieces, each in its own
        subspace: the token x_h, then the copy of each copyer head; they sum to it exactly.
        Labels: "token", "L0H0", ..., "L0H{K-1}"."""
        cache = cache if isinstance(cache, CausalCache) else CausalCache(cache.cache_dict, self)
        heads, labels = cache.stack_head_results(layer=1, return_labels=True)
        token = cache.token_piece()
        return torch.cat([token[None], heads]), ["token", *labels]

    # Readable views of the mechanism ------------------------------------------------------------
    def copyer_pattern(self) -> Float[Tensor, "K H T"]:
        """The blocks.0 attention pattern (the same for every context)."""
        return self.blocks[0].attn.softmax(self.blocks[0].attn.scores())

    @property
    def W_KQ(self) -> Float[Tensor, "D D"]:
        return self.blocks[1].attn.W_KQ

    @property
    def W_OV(self) -> Float[Tensor, "D d"]:
        return self.blocks[1].attn.W_OV
