"""The two-layer model on real vectors (Proposition 2): the continuous task of ``probes.continuous``.

The architecture of ``models.nets.causal_transformer`` unchanged up to blocks.1's scores: the same copyer
layer (``CopyerAttention``, any [batch, T, d] input), the same disentangled residual and the same
bilinear scores ``k_h'^T W_KQ q_h`` over h' < h (query token subspace zeroed). Only the values and the
output differ: the value of key h' is linear, ``v_h' = z_h' @ W_OV`` (a predicted mean, not a
log-distribution), and the output is the attention-weighted mean ``sum_h' A_h' v_h'``. Row 0 (the root)
predicts the learned prior mean ``b_root`` (0 for the true task). Trained by squared error
(``models.train`` with ``--task-kind continuous``); the hooks are those of ``CausalTransformer`` plus
``hook_mean`` [batch, H, d] (``hook_log_probs`` is unused here). The config's ``d_vocab`` is the
vector dimension d.

A Theorem-1 analogue (``bma_bilinear_model``): sharp copyers, ``W_KQ`` blocks ``c1 A`` and the
``W_OV`` token block ``rho A`` give BMA's scores WITHOUT the quadratic term ``c2 sum ||x_h'||^2``.
"""

from __future__ import annotations

import math

import einops
import torch
from jaxtyping import Float
from torch import Tensor
from transformer_lens.hook_points import HookPoint

from models.nets.causal_transformer import BilinearAttention, CausalTransformer, CausalTransformerConfig
from probes.continuous import (
    ContinuousTask,
    check_vectors,
    gaussian_bma_posterior,
    gaussian_coefficients,
)


class MeanAttention(BilinearAttention):
    """blocks.1 for vectors: bilinear scores as in ``BilinearAttention``; values ``z_h' W_OV``
    (``hook_v`` [batch, H, 1, d]) and the output their attention-weighted mean (``hook_z``)."""

    def forward(self, resid: Float[Tensor, "batch H D"]) -> Float[Tensor, "batch H 1 d"]:
        pattern = self.attention(resid)
        v = self.hook_v((resid @ self.W_OV).unsqueeze(2))
        return self.hook_result(self.hook_z(einops.einsum(pattern, v, "b n query key, b key n d -> b query n d")))


class ContinuousTransformer(CausalTransformer):
    """``model(x Float[batch, (L+1)H, d])`` -> predicted means ``[batch, H, d]`` of the target vectors."""

    select_attention = MeanAttention

    def __init__(self, cfg: CausalTransformerConfig):
        super().__init__(cfg)
        self.hook_mean = HookPoint()  # [batch, H, d]: the output
        self.setup()

    def forward(self, x: Float[Tensor, "batch T d"]) -> Float[Tensor, "batch H d"]:
        cfg = self.cfg
        x = check_vectors(x, cfg.d_vocab, cfg.n_examples, cfg.seq_len)
        x = self.hook_embed(x.to(self.b_root.device, cfg.torch_dtype, non_blocking=x.is_pinned()))
        mean = self.layers(x)
        return self.hook_mean(torch.cat([self.b_root.expand(len(x), 1, -1), mean[:, 1:]], 1))


def mse_loss(model, x: Tensor, target: Float[Tensor, "batch H d"]) -> Tensor:
    """The training loss: mean squared error of the predicted means (every position and coordinate)."""
    return (model(x) - target).pow(2).mean()


@torch.no_grad()
def bma_bilinear_model(task: ContinuousTask, beta: float = 30.0, dtype: str = "float64") -> ContinuousTransformer:
    """Sharp copyers (head k copies demonstration k), ``W_KQ`` copy blocks ``c1 A``, ``W_OV`` token block
    ``rho A``: the best the architecture can do with BMA's bilinear coefficient, quadratic term dropped."""
    d, L, H = task.d_vocab, task.n_examples, task.seq_len
    model = ContinuousTransformer(CausalTransformerConfig(d, L, H, n_copy_heads=L, dtype=dtype))
    copy = model.blocks[0].attn
    copy.w_H.fill_(-beta)
    copy.w_H[:, H - 1] = beta
    copy.w_L.fill_(-beta)
    copy.w_L[:, :L].diagonal().fill_(beta)
    c1, _ = gaussian_coefficients(task.rho)
    A = task.A.to(model.W_KQ.dtype)
    for k in range(1, L + 1):
        model.W_KQ[k * d : (k + 1) * d, k * d : (k + 1) * d] = c1 * A
    model.W_OV[:d] = task.rho * A
    return model.eval()


def gaussian_nll(mean: Float[Tensor, "batch H d"], x: Tensor, task: ContinuousTask) -> float:
    """Mean over contexts and h >= 1 of -log N(x_h^{L+1}; mean, (1 - rho^2) I): the model's implied
    predictive density with the task's known noise variance."""
    s2 = 1 - task.rho**2
    d = task.d_vocab
    sq = ((mean.double() - x[:, -task.seq_len :].double()) ** 2).sum(-1)[:, 1:]
    return (0.5 * sq / s2 + 0.5 * d * math.log(2 * math.pi * s2)).mean().item()


def bma_nll(task: ContinuousTask, x: Tensor) -> float:
    """Mean over contexts and h >= 1 of -log of BMA's exact predictive, the Gaussian mixture
    ``sum_h' P(pa(h) = h' | demos) N(x_h^{L+1}; rho A^T x_h'^{L+1}, (1 - rho^2) I)``."""
    s2 = 1 - task.rho**2
    d, H = task.d_vocab, task.seq_len
    target = x.double()[:, -H:]
    means = task.rho * target @ task.A  # [b, h', d]: the mean each candidate parent predicts
    sq = ((target.unsqueeze(2) - means.unsqueeze(1)) ** 2).sum(-1)  # [b, h, h']
    log_post = gaussian_bma_posterior(task, x).log()  # -inf off the candidates
    log_mix = (log_post - 0.5 * sq / s2).logsumexp(-1) - 0.5 * d * math.log(2 * math.pi * s2)
    return -log_mix[:, 1:].mean().item()
