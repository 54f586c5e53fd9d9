"""A standard decoder-only transformer with TransformerLens 2.x/3.x names, for models trained elsewhere.

TransformerLens 4 can no longer build a ``HookedTransformer``; this module rebuilds the part of it that
small models trained on toy tasks use, so their state dicts (``models.loading.converters``) load into a
``transformer_lens.HookedRootModule`` with the same parameter names, shapes, hook names and equations:

    resid = embed.W_E[ids] + pos_embed.W_pos[pos]                     hook_embed, hook_pos_embed
    per block i (pre-norm):
      q, k, v = ln1(resid) @ W_Q/W_K/W_V + b_Q/b_K/b_V                 [batch, pos, head, d_head]
      scores = q.k / attn_scale (sqrt(d_head); x (i+1) with            hook_attn_scores [batch, head, q, k]
               scale_attn_by_inverse_layer_idx), causal mask -inf
      z = softmax(scores) @ v; attn_out = sum_heads z @ W_O + b_O       hook_pattern, hook_z, hook_attn_out
      resid_mid = resid + attn_out                                     (attention-only: resid_post)
      mlp_out = act(ln2(resid_mid) @ W_in + b_in) @ W_out + b_out      mlp.hook_pre/hook_post, hook_mlp_out
      resid_post = resid_mid + mlp_out
    logits = ln_final(resid) @ unembed.W_U + unembed.b_U               [batch, pos, d_vocab_out]
    (``logits_at(ids, positions, columns)``: those logits only, the columns' slice of W_U at those positions)

Covered (anything else is a one-line ``ValueError``): attention-only or with an MLP; normalisation
``"LN"`` (``(x - mean) / sqrt(var + eps) * w + b``), ``"LNPre"`` (the same without w, b: TransformerLens
after ``fold_ln``) or ``None``; learned absolute positions (``"standard"``); ``act_fn`` ``"gelu"`` (exact,
erf), ``"gelu_new"`` (tanh approximation, GPT-2's), ``"relu"``; a causal mask; scores divided by
``attn_scale`` (``sqrt(d_head)`` by default; 1 when ``use_attn_scale`` is off, whatever ``attn_scale`` says,
as TransformerLens does), times ``i + 1`` in block i with ``scale_attn_by_inverse_layer_idx``.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, asdict, dataclass, fields

import einops
import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformer_lens import ActivationCache, HookedRootModule
from transformer_lens.hook_points import HookPoint

from models.nets.dtypes import RUN_DTYPES, torch_dtype
from models.plumbing.io import check_memory, check_tensors

NORMALIZATIONS = ("LN", "LNPre", None)
ACTIVATIONS = ("gelu", "gelu_new", "relu")
POSITIONAL = ("standard",)


def gelu_new(x: Tensor) -> Tensor:
    """GPT-2's tanh approximation of GELU (TransformerLens ``gelu_new``, Hugging Face ``gelu_new``):
    ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, torch's fused kernel of that formula (3x faster
    than the formula spelled in tensor ops, equal to float rounding: tests/models/nets)."""
    return F.gelu(x, approximate="tanh")


ACT_FNS = {"gelu": F.gelu, "gelu_new": gelu_new, "relu": F.relu}


@dataclass
class HookedTransformerConfig:
    """The fields of TransformerLens's ``HookedTransformerConfig`` that this model covers."""

    n_layers: int
    d_model: int
    n_ctx: int
    d_head: int
    n_heads: int
    d_vocab: int
    d_mlp: int | None = None  # None: 4 d_model (TransformerLens's default) unless attn_only
    act_fn: str | None = None
    normalization_type: str | None = "LN"
    attn_only: bool = False
    positional_embedding_type: str = "standard"
    eps: float = 1e-5
    d_vocab_out: int = -1  # -1: d_vocab
    use_attn_scale: bool = True
    attn_scale: float = -1.0  # -1: sqrt(d_head); not read when use_attn_scale is off
    scale_attn_by_inverse_layer_idx: bool = False  # block i divides its scores by (i + 1) as well
    use_attn_result: bool = False  # compute blocks.{i}.attn.hook_result [batch, pos, head, d_model]
    device: str = "cpu"
    dtype: str = "float32"

    # TransformerLens tools read these.
    n_key_value_heads = None

    def __post_init__(self):
        for name in ("n_layers", "d_model", "n_ctx", "d_head", "n_heads", "d_vocab"):
            _positive_int(name, getattr(self, name))
        if self.normalization_type not in NORMALIZATIONS:
            raise ValueError(f"normalization_type={self.normalization_type!r} is not covered; covered: LN, LNPre, None")
        if self.positional_embedding_type not in POSITIONAL:
            raise ValueError(
                f"positional_embedding_type={self.positional_embedding_type!r} is not covered; "
                f"covered: 'standard' (learned absolute positions)"
            )
        if not self.attn_only:
            if self.act_fn not in ACTIVATIONS:
                raise ValueError(f"act_fn={self.act_fn!r} is not covered; covered: {', '.join(ACTIVATIONS)}")
            if self.d_mlp is None:
                self.d_mlp = 4 * self.d_model
            _positive_int("d_mlp", self.d_mlp)
        if self.d_vocab_out == -1:
            self.d_vocab_out = self.d_vocab
        _positive_int("d_vocab_out", self.d_vocab_out)
        if self.use_attn_scale and self.attn_scale == -1.0:
            self.attn_scale = math.sqrt(self.d_head)
        if self.use_attn_scale and (not isinstance(self.attn_scale, (int, float)) or not self.attn_scale > 0):
            raise ValueError(f"attn_scale must be a positive number (or use_attn_scale false), got {self.attn_scale!r}")
        if not isinstance(self.eps, (int, float)) or not self.eps > 0:
            raise ValueError(f"eps must be a positive number, got {self.eps!r}")
        for name in ("attn_only", "use_attn_scale", "use_attn_result", "scale_attn_by_inverse_layer_idx"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.dtype not in RUN_DTYPES:
            raise ValueError(f"dtype={self.dtype!r} is not covered; covered: {', '.join(RUN_DTYPES)}")
        what = (
            f"a model of n_layers={self.n_layers}, d_model={self.d_model}, n_heads={self.n_heads}, "
            f"d_head={self.d_head}, n_ctx={self.n_ctx}, d_vocab={self.d_vocab} ({self.dtype})"
        )
        check_tensors(self.n_tensors(), what)  # sized before any tensor is made: every model is made of a config
        if self.device != "meta":
            check_memory(self.n_bytes(), what, self.device)

    def n_tensors(self) -> int:
        """The parameters and buffers of ``HookedTransformer(self)``, counted from the config."""
        norm = 2 if self.normalization_type == "LN" else 0
        block = 9 + norm + (0 if self.attn_only else 4 + norm)  # attention: 8 weights + the mask
        return self.n_layers * block + 4 + norm  # W_E, W_pos, W_U, b_U, ln_final

    def n_bytes(self) -> int:
        """Bytes of the parameters and buffers of ``HookedTransformer(self)``, by arithmetic (nothing allocated)."""
        D, n, e, C = self.d_model, self.n_heads, self.d_head, self.n_ctx
        norm = 2 * D if self.normalization_type == "LN" else 0
        attn = 4 * n * D * e + 3 * n * e + D + norm
        mlp = 0 if self.attn_only else 2 * D * self.d_mlp + self.d_mlp + D + norm
        top = self.d_vocab * D + C * D + D * self.d_vocab_out + self.d_vocab_out + norm
        itemsize = torch.empty((), dtype=self.torch_dtype).element_size()
        return (self.n_layers * (attn + mlp) + top) * itemsize + self.n_layers * C * C  # the masks: bool, C x C

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype)

    def scale(self, layer: int) -> float:
        """What block ``layer``'s scores are divided by (TransformerLens ``AbstractAttention.attn_scale``)."""
        scale = float(self.attn_scale) if self.use_attn_scale else 1.0
        return scale * (layer + 1) if self.scale_attn_by_inverse_layer_idx else scale

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> HookedTransformerConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown config fields {unknown}; expected a subset of {sorted(known)}")
        missing = sorted(f.name for f in fields(cls) if f.default is MISSING and f.name not in d)
        if missing:
            raise ValueError(f"config lacks {missing}")
        return cls(**d)


def _positive_int(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"config field {name} must be a positive integer, got {value!r}")


class LayerNorm(nn.Module):
    """TransformerLens ``LayerNorm`` (``w``, ``b``) or, with ``affine=False``, ``LayerNormPre``."""

    def __init__(self, cfg: HookedTransformerConfig, affine: bool):
        super().__init__()
        self.eps = cfg.eps
        if affine:
            self.w = nn.Parameter(torch.ones(cfg.d_model, dtype=cfg.torch_dtype, device=cfg.device))
            self.b = _zeros(cfg, cfg.d_model)
        self.affine = affine
        self.hook_scale = HookPoint()  # [batch, pos, 1]
        self.hook_normalized = HookPoint()  # [batch, pos, d_model]

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        x = x - x.mean(-1, keepdim=True)
        x = x / self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x * self.w + self.b if self.affine else x)


def _zeros(cfg: HookedTransformerConfig, *shape: int) -> nn.Parameter:
    """A parameter of zeros of ``shape`` in the config's dtype and on its device (its values come from the state dict loaded into it)."""
    return nn.Parameter(torch.zeros(*shape, dtype=cfg.torch_dtype, device=cfg.device))


def normalization(cfg: HookedTransformerConfig) -> nn.Module:
    if cfg.normalization_type is None:
        return nn.Identity()
    return LayerNorm(cfg, affine=cfg.normalization_type == "LN")


class Attention(nn.Module):
    def __init__(self, cfg: HookedTransformerConfig, layer: int):
        super().__init__()
        self.cfg = cfg
        self.scale = cfg.scale(layer)
        n, d, e = cfg.n_heads, cfg.d_model, cfg.d_head
        self.W_Q = _zeros(cfg, n, d, e)
        self.W_K = _zeros(cfg, n, d, e)
        self.W_V = _zeros(cfg, n, d, e)
        self.W_O = _zeros(cfg, n, e, d)
        self.b_Q = _zeros(cfg, n, e)
        self.b_K = _zeros(cfg, n, e)
        self.b_V = _zeros(cfg, n, e)
        self.b_O = _zeros(cfg, d)
        self.register_buffer("mask", torch.ones(cfg.n_ctx, cfg.n_ctx, dtype=torch.bool).tril(), persistent=False)
        self.hook_q = HookPoint()  # [batch, pos, head, d_head]
        self.hook_k = HookPoint()
        self.hook_v = HookPoint()
        self.hook_attn_scores = HookPoint()  # [batch, head, query, key], -inf above the diagonal
        self.hook_pattern = HookPoint()  # [batch, head, query, key]
        self.hook_z = HookPoint()  # [batch, pos, head, d_head]
        self.hook_result = HookPoint()  # [batch, pos, head, d_model]; only with cfg.use_attn_result

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        proj = "b p d, n d e -> b p n e"
        q = self.hook_q(einops.einsum(x, self.W_Q, proj) + self.b_Q)
        k = self.hook_k(einops.einsum(x, self.W_K, proj) + self.b_K)
        v = self.hook_v(einops.einsum(x, self.W_V, proj) + self.b_V)
        scores = einops.einsum(q, k, "b q n e, b k n e -> b n q k") / self.scale
        T = x.shape[1]
        scores = self.hook_attn_scores(scores.masked_fill(~self.mask[:T, :T], float("-inf")))
        pattern = self.hook_pattern(scores.softmax(-1))
        z = self.hook_z(einops.einsum(pattern, v, "b n q k, b k n e -> b q n e"))
        if self.cfg.use_attn_result:
            result = self.hook_result(einops.einsum(z, self.W_O, "b p n e, n e d -> b p n d"))
            return result.sum(2) + self.b_O
        return einops.einsum(z, self.W_O, "b p n e, n e d -> b p d") + self.b_O


class MLP(nn.Module):
    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        self.W_in = _zeros(cfg, cfg.d_model, cfg.d_mlp)
        self.b_in = _zeros(cfg, cfg.d_mlp)
        self.W_out = _zeros(cfg, cfg.d_mlp, cfg.d_model)
        self.b_out = _zeros(cfg, cfg.d_model)
        self.act = ACT_FNS[cfg.act_fn]
        self.hook_pre = HookPoint()  # [batch, pos, d_mlp]
        self.hook_post = HookPoint()  # [batch, pos, d_mlp]

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        post = self.hook_post(self.act(self.hook_pre(x @ self.W_in + self.b_in)))
        return post @ self.W_out + self.b_out


class TransformerBlock(nn.Module):
    def __init__(self, cfg: HookedTransformerConfig, layer: int):
        super().__init__()
        self.cfg = cfg
        self.ln1 = normalization(cfg)
        self.attn = Attention(cfg, layer)
        self.hook_resid_pre = HookPoint()  # [batch, pos, d_model]
        self.hook_attn_out = HookPoint()
        self.hook_resid_post = HookPoint()
        if not cfg.attn_only:
            self.ln2 = normalization(cfg)
            self.mlp = MLP(cfg)
            self.hook_resid_mid = HookPoint()
            self.hook_mlp_out = HookPoint()

    def forward(self, resid: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        resid = self.hook_resid_pre(resid)
        resid = resid + self.hook_attn_out(self.attn(self.ln1(resid)))
        if self.cfg.attn_only:
            return self.hook_resid_post(resid)
        resid = self.hook_resid_mid(resid)
        return self.hook_resid_post(resid + self.hook_mlp_out(self.mlp(self.ln2(resid))))


class Embed(nn.Module):
    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        self.W_E = _zeros(cfg, cfg.d_vocab, cfg.d_model)


class PosEmbed(nn.Module):
    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        self.W_pos = _zeros(cfg, cfg.n_ctx, cfg.d_model)


class Unembed(nn.Module):
    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        self.W_U = _zeros(cfg, cfg.d_model, cfg.d_vocab_out)
        self.b_U = _zeros(cfg, cfg.d_vocab_out)


class HookedTransformer(HookedRootModule):
    """``model(ids)`` -> logits ``[batch, pos, d_vocab_out]``; TransformerLens parameter and hook names."""

    def __init__(self, cfg: HookedTransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = Embed(cfg)
        self.pos_embed = PosEmbed(cfg)
        self.hook_embed = HookPoint()  # [batch, pos, d_model]
        self.hook_pos_embed = HookPoint()  # [batch, pos, d_model]
        self.blocks = nn.ModuleList([TransformerBlock(cfg, i) for i in range(cfg.n_layers)])
        if cfg.normalization_type is not None:
            self.ln_final = normalization(cfg)
        self.unembed = Unembed(cfg)
        self.setup()

    def forward(self, ids: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_vocab_out"]:
        return self.final_residual(ids) @ self.unembed.W_U + self.unembed.b_U

    def logits_at(
        self, ids: Int[Tensor, "batch pos"], positions: Int[Tensor, " P"], columns: slice
    ) -> Float[Tensor, "batch P C"]:
        """``forward(ids)[:, positions, columns]`` without the other logits: the unembedding of those columns
        at those positions only (``ln_final`` once, at every position, as ``forward``), so that the memory
        and work of a read-out grow with the task's tokens, not with ``d_vocab_out``."""
        resid = self.final_residual(ids)[:, positions.to(self.unembed.W_U.device)]
        return resid @ self.unembed.W_U[:, columns] + self.unembed.b_U[columns]

    def final_residual(self, ids: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        """The residual the unembedding reads: every block, then ``ln_final``."""
        cfg = self.cfg
        if not isinstance(ids, Tensor) or ids.ndim != 2 or ids.is_floating_point() or ids.is_complex():
            raise ValueError(f"input must be an integer tensor [batch, pos], got {_describe(ids)}")
        if ids.shape[1] > cfg.n_ctx:
            raise ValueError(f"input has {ids.shape[1]} positions; the model has n_ctx={cfg.n_ctx}")
        if ids.numel() and (ids.min() < 0 or ids.max() >= cfg.d_vocab):
            raise ValueError(f"input ids must lie in 0..{cfg.d_vocab - 1}, got {ids.min().item()}..{ids.max().item()}")
        ids = ids.to(self.embed.W_E.device)
        resid = self.hook_embed(self.embed.W_E[ids]) + self.hook_pos_embed(
            self.pos_embed.W_pos[: ids.shape[1]].expand(len(ids), -1, -1)
        )
        for block in self.blocks:
            resid = block(resid)
        return self.ln_final(resid) if cfg.normalization_type is not None else resid

    def run_with_cache(self, *args, **kwargs) -> tuple[Tensor, ActivationCache]:
        """As ``HookedRootModule.run_with_cache``, with the cache wrapped in an ``ActivationCache``."""
        out, cache = super().run_with_cache(*args, **kwargs)
        return out, cache if isinstance(cache, ActivationCache) else ActivationCache(cache, self)


def _describe(x) -> str:
    if isinstance(x, Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return type(x).__name__
