"""The continuous variant (docs/paper.md sections 1 and 4, Proposition 2) and its exact Gaussian BMA.

``x_1 ~ N(0, I_d)``, ``x_h = rho A^T x_pa(h) + sqrt(1 - rho^2) eta_h`` with A orthogonal (fixed per
experiment) and ``eta_h ~ N(0, I_d)``; every marginal is N(0, I_d). Same flat layout as the discrete
task: a context is ``Float[batch, (L+1) H, d]``, flat index ``l * H + h``, ``l = L`` the target.

BMA (uniform prior over parents): with ``s2 = 1 - rho^2``, the log-likelihood of candidate h' is
``sum_l log N(x_h^l; rho A^T x_h'^l, s2 I) = c1 sum_l x_h'^l . A x_h^l + c2 sum_l ||x_h'^l||^2 + const(h)``
with ``c1 = rho / s2`` and ``c2 = -rho^2 / (2 s2)``: the quadratic term is not bilinear in (x_h', x_h).
The predictive mean of the target is ``sum_h' P(pa(h) = h' | demos) rho A^T x_h'^{L+1}``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from probes.tasks import MarkovTreeTask, parent_values, task_header


def check_orthogonal(A: Tensor) -> Tensor:
    """Validate a square orthogonal matrix; return it as float64."""
    A = torch.as_tensor(A, dtype=torch.float64)
    if A.ndim != 2 or A.shape[0] != A.shape[1] or A.shape[0] < 1:
        raise ValueError(f"A must be a square d x d matrix, got shape {tuple(A.shape)}")
    err = (A @ A.T - torch.eye(A.shape[0], dtype=torch.float64)).abs().max().item()
    if not err < 1e-8:
        raise ValueError(f"A must be orthogonal (A A^T = I), but |A A^T - I| reaches {err:.3g}")
    return A


def check_vectors(x: Tensor, d: int, n_examples: int, seq_len: int) -> Float[Tensor, "batch T d"]:
    """Validate a batch of flat continuous contexts ``[batch, (L+1) H, d]`` of finite reals."""
    x = torch.as_tensor(x)
    T = (n_examples + 1) * seq_len
    if not x.dtype.is_floating_point:
        raise ValueError(f"continuous contexts must be real vectors, got dtype {x.dtype}")
    if x.ndim != 3 or x.shape[1:] != (T, d):
        raise ValueError(
            f"contexts must have shape [batch, (L+1)*H, d] = [batch, {T}, {d}] "
            f"(L={n_examples}, H={seq_len}), got {tuple(x.shape)}"
        )
    if not torch.isfinite(x).all():
        raise ValueError("contexts contain NaN or Inf; expected finite vectors")
    return x


@dataclass
class ContinuousTask:
    """``A`` [d, d] orthogonal, ``rho`` in (0, 1), L demonstrations and H positions; a fresh tree per context."""

    A: Float[Tensor, "d d"]
    rho: float
    n_examples: int
    seq_len: int

    def __post_init__(self):
        self.A = check_orthogonal(self.A)
        if not 0 < self.rho < 1:
            raise ValueError(f"rho must lie in (0, 1), got {self.rho}")
        if self.n_examples < 1 or self.seq_len < 2:
            raise ValueError(f"need n_examples >= 1 and seq_len >= 2, got {self.n_examples}, {self.seq_len}")

    @property
    def d_vocab(self) -> int:
        """The vector dimension d (named as in the discrete task so configs line up)."""
        return self.A.shape[0]

    @classmethod
    def random(cls, d: int, n_examples: int, seq_len: int, rho: float = 0.5, seed: int = 0) -> ContinuousTask:
        """A Haar-random orthogonal A drawn from ``seed`` (QR of a Gaussian matrix, signs fixed)."""
        g = torch.Generator().manual_seed(seed)
        q, r = torch.linalg.qr(torch.randn(d, d, dtype=torch.float64, generator=g))
        return cls(q * torch.sign(torch.diagonal(r)), rho, n_examples, seq_len)

    sample_parents = MarkovTreeTask.sample_parents

    def sample(
        self, batch: int, generator: torch.Generator | None = None, parents: Int[Tensor, "batch H"] | None = None
    ) -> tuple[Float[Tensor, "batch T d"], Int[Tensor, "batch H"]]:
        """``batch`` contexts (float64) and their trees (``parents[:, 0] = -1``)."""
        if parents is None:
            parents = self.sample_parents(batch, generator)
        L1, H, d = self.n_examples + 1, self.seq_len, self.d_vocab
        noise = torch.randn(batch, L1, H, d, dtype=torch.float64, generator=generator)
        x = torch.empty_like(noise)
        x[:, :, 0] = noise[:, :, 0]
        s = math.sqrt(1 - self.rho**2)
        for h in range(1, H):
            x[:, :, h] = self.rho * parent_values(x, parents, h) @ self.A + s * noise[:, :, h]  # row form of rho A^T x
        return x.reshape(batch, L1 * H, d), parents

    def to_dict(self) -> dict:
        return {
            **task_header(self, "continuous"),
            "rho": self.rho,
            "A": self.A.tolist(),
            "layout": {"order": "example-major"},  # flat index l*H + h, l = n_examples the target; x is [batch, T, d]
        }

    @classmethod
    def from_dict(cls, d: dict) -> ContinuousTask:
        missing = {"A", "rho", "n_examples", "seq_len"} - set(d)
        if missing or d.get("kind") != "continuous":
            raise ValueError(f"not a continuous task description (kind {d.get('kind')!r}, missing {sorted(missing)})")
        return cls(torch.tensor(d["A"], dtype=torch.float64), float(d["rho"]), int(d["n_examples"]), int(d["seq_len"]))


def gaussian_coefficients(rho: float) -> tuple[float, float]:
    """``(c1, c2)`` of the BMA logit ``c1 sum x_h'.A x_h + c2 sum ||x_h'||^2``."""
    s2 = 1 - rho**2
    return rho / s2, -(rho**2) / (2 * s2)


def gaussian_bma_scores(task: ContinuousTask, x: Tensor) -> Float[Tensor, "batch H H"]:
    """BMA logits at [b, h, h'] (float64), bilinear plus quadratic term; -inf where h' >= h."""
    L, H, d = task.n_examples, task.seq_len, task.d_vocab
    demos = check_vectors(x, d, L, H).double().view(-1, L + 1, H, d)[:, :L]
    c1, c2 = gaussian_coefficients(task.rho)
    bilinear = torch.einsum("blgi,ij,blhj->bhg", demos, task.A, demos)  # sum_l x_g^l . A x_h^l at [b, h, g]
    quadratic = (demos**2).sum((1, 3)).unsqueeze(1)  # sum_l ||x_g^l||^2 at [b, 1, g]
    scores = c1 * bilinear + c2 * quadratic
    return scores.masked_fill(~torch.ones(H, H, dtype=torch.bool).tril(-1), float("-inf"))


def softmax_rows(scores: Float[Tensor, "batch H H"]) -> Float[Tensor, "batch H H"]:
    """Softmax over candidates h' < h; row 0 (no candidate) all zeros."""
    return torch.cat([torch.zeros_like(scores[:, :1]), scores[:, 1:].softmax(-1)], 1)


def gaussian_bma_posterior(task: ContinuousTask, x: Tensor) -> Float[Tensor, "batch H H"]:
    """P(pa(h) = h' | demonstrations) at [b, h, h'] (float64); row 0 zeros."""
    return softmax_rows(gaussian_bma_scores(task, x))


def predictive_mean(
    task: ContinuousTask, x: Tensor, attention: Float[Tensor, "batch H H"]
) -> Float[Tensor, "batch H d"]:
    """``sum_h' attention[h, h'] rho A^T x_h'^{L+1}`` (row 0: the prior mean 0)."""
    target = x.double().view(-1, task.n_examples + 1, task.seq_len, task.d_vocab)[:, -1]
    return attention.double() @ (task.rho * target @ task.A)


def gaussian_bma_mean(task: ContinuousTask, x: Tensor) -> Float[Tensor, "batch H d"]:
    """The BMA predictive mean of every target vector."""
    return predictive_mean(task, x, gaussian_bma_posterior(task, x))


def target_mse(mean: Float[Tensor, "batch H d"], x: Tensor, seq_len: int) -> float:
    """Mean over contexts, positions h >= 1 and coordinates of (prediction - x_h^{L+1})^2."""
    target = x[:, -seq_len:].to(mean.device, torch.float64)
    return ((mean.double() - target) ** 2)[:, 1:].mean().item()
