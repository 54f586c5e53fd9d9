"""CAPE steps 2 and 3 (arXiv 2509.16629): embed a weighted causal DAG in the hyperboloid, map it to the
Poincare ball, and read off rotary angles.

- Hyperboloid ``H^n = {p in R^{n+1}: <p, p>_L = -1, p_0 > 0}``, ``<x, y>_L = -x_0 y_0 + sum_i x_i y_i``,
  geodesic distance ``d(x, y) = arccosh(-<x, y>_L)``, origin ``o = (1, 0, ..., 0)``.
- Loss (the paper's ``L_H``): per node ``v``, an InfoNCE contrast on ``exp(-d_L^2)`` whose positives are
  its k-hop neighbours in the undirected skeleton, each weighted by the strongest path product of ``|A|``
  within k hops, and whose negatives are all nodes further than k hops; plus ``lambda_g * sum_v pi_v d_L^2(p_v, o)`` with
  ``pi`` the PageRank of the REVERSED graph (rank flows from effects to causes, so roots and high
  out-degree nodes, the causally general ones, get the most rank and are pulled to the origin) and
  ``d_L^2(x, y) = -2 - 2 <x, y>_L = 2 (cosh d - 1)`` the squared Lorentzian distance. It replaces the
  geodesic ``d`` in both terms because ``d`` is not differentiable where two points meet: with ``d`` in the
  contrast, positives collapse onto each other, SGD oscillates there, and round-off differences grew
  from 1e-12 to 1e-3 over 300 steps (measured), breaking the permutation equivariance in floating point.
- Riemannian SGD: Minkowski gradient, projection to the tangent space, exponential map (then a
  reprojection onto the sheet against round-off). Full batch, float64, seeded: deterministic on CPU.
- Step 3: ``e_v = x_{1:} / (1 + x_0)`` in the unit Poincare ball, ``phi_v = c e_v`` with ``c = pi/4``.

``A[i, j] != 0`` means an edge ``i -> j`` (the convention of CAPE step 1, ``cape.structure``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

C_ANGLE = math.pi / 4  # the paper's c in phi_v = c e_v


# ----------------------------------------------------------------------------- graphs


def check_dag(A) -> Float[Tensor, "M M"]:
    """``A`` as a float64 tensor after checking it is a finite square weighted DAG (ValueError if not)."""
    A = torch.as_tensor(A, dtype=torch.float64)
    if A.ndim != 2 or A.shape[0] != A.shape[1] or A.shape[0] < 2:
        raise ValueError(f"A must be a square M x M matrix with M >= 2, got shape {tuple(A.shape)}")
    if not torch.isfinite(A).all():
        raise ValueError("A has non-finite entries; expected finite edge weights")
    reach = (A != 0).double()
    power = reach.clone()
    for _ in range(A.shape[0]):  # nilpotent <=> acyclic (self-loops included)
        if not power.any():
            return A
        power = ((power @ reach) > 0).double()
    raise ValueError("A has a directed cycle; expected a DAG (A[i, j] != 0 is an edge i -> j)")


def hop_distance(A) -> Float[np.ndarray, "M M"]:
    """Shortest-path length in the undirected skeleton of ``A`` (``inf`` between components)."""
    adj = (np.asarray(A) != 0) | (np.asarray(A) != 0).T
    M = adj.shape[0]
    D = np.full((M, M), np.inf)
    for s in range(M):
        D[s, s] = 0
        frontier, t = [s], 0
        while frontier:
            t += 1
            nxt = [j for i in frontier for j in np.flatnonzero(adj[i]) if D[s, j] == np.inf]
            for j in nxt:
                D[s, j] = t
            frontier = list(dict.fromkeys(nxt))
    return D


def hop_weights(A, k: int = 2) -> Float[Tensor, "M M"]:
    """``W[i, j]`` = the largest product of ``|A|`` along an undirected path of at most ``k`` edges from i
    to j (0 if none; 0 on the diagonal): the positive-pair weights of the contrastive loss."""
    if k < 1:
        raise ValueError(f"k (hops) must be >= 1, got {k}")
    A = check_dag(A).abs()
    S = torch.maximum(A, A.T)
    W, step = S.clone(), S.clone()
    for _ in range(k - 1):
        step = (step.unsqueeze(-1) * S.unsqueeze(0)).amax(1)  # max-product semiring
        W = torch.maximum(W, step)
    return W.fill_diagonal_(0)


def generality(A, damping: float = 0.85, iters: int = 200) -> Float[Tensor, " M"]:
    """PageRank of the reversed graph weighted by ``|A|`` (sums to 1): high for roots and for nodes with
    many or strong outgoing edges, low for leaves."""
    A = check_dag(A).abs()
    M = A.shape[0]
    out = A.T  # reversed: an edge i -> j sends j's rank to i
    deg = out.sum(1, keepdim=True)
    P = torch.where(deg > 0, out / deg.clamp_min(1e-300), torch.full_like(out, 1 / M))  # dangling: uniform
    r = torch.full((M,), 1 / M, dtype=torch.float64)
    for _ in range(iters):
        r = (1 - damping) / M + damping * (r @ P)
    return r / r.sum()


# ----------------------------------------------------------------------------- the hyperboloid


def minkowski_dot(x: Float[Tensor, "... n1"], y: Float[Tensor, "... n1"]) -> Float[Tensor, "..."]:
    """``<x, y>_L = -x_0 y_0 + sum_i x_i y_i``."""
    return (x * y).sum(-1) - 2 * x[..., 0] * y[..., 0]


def lift(x: Float[Tensor, "... n"]) -> Float[Tensor, "... n1"]:
    """The hyperboloid point above spatial coordinates ``x``: ``(sqrt(1 + |x|^2), x)``."""
    return torch.cat([(1 + (x * x).sum(-1, keepdim=True)).sqrt(), x], -1)


def distance(x: Float[Tensor, "... n1"], y: Float[Tensor, "... n1"]) -> Float[Tensor, "..."]:
    """Geodesic distance ``arccosh(-<x, y>_L)`` (clamped at 1 against round-off)."""
    return torch.acosh((-minkowski_dot(x, y)).clamp_min(1 + 1e-12))


def sq_lorentz(x: Float[Tensor, "... n1"], y: Float[Tensor, "... n1"]) -> Float[Tensor, "..."]:
    """Squared Lorentzian distance ``-2 - 2 <x, y>_L = 2 (cosh d(x, y) - 1)``: increasing in the geodesic
    distance and, unlike it, smooth where two points meet."""
    return -2 - 2 * minkowski_dot(x, y)


def expmap(p: Float[Tensor, "... n1"], v: Float[Tensor, "... n1"]) -> Float[Tensor, "... n1"]:
    """``exp_p(v) = cosh(|v|) p + sinh(|v|) v / |v|`` for a tangent vector ``v`` at ``p``."""
    norm = minkowski_dot(v, v).clamp_min(0).sqrt().unsqueeze(-1)
    safe = norm.clamp_min(1e-15)
    return torch.cosh(norm) * p + torch.sinh(norm) * v / safe


def riemannian_grad(p: Float[Tensor, "... n1"], g: Float[Tensor, "... n1"]) -> Float[Tensor, "... n1"]:
    """The Riemannian gradient at ``p`` of a function with ambient Euclidean gradient ``g``:
    ``h = diag(-1, 1, ..., 1) g`` projected onto the tangent space, ``h + <p, h>_L p``."""
    h = g.clone()
    h[..., 0] = -h[..., 0]
    return h + minkowski_dot(p, h).unsqueeze(-1) * p


def to_poincare(p: Float[Tensor, "... n1"]) -> Float[Tensor, "... n"]:
    """The diffeomorphism ``H^n -> B^n``: ``e = p_{1:} / (1 + p_0)`` (inside the unit ball)."""
    return p[..., 1:] / (1 + p[..., :1])


def angles(e: Float[Tensor, "... n"], c: float = C_ANGLE) -> Float[Tensor, "... n"]:
    """CAPE's rotary angles ``phi_v = c e_v`` (each in ``(-c, c)``)."""
    return c * e


# ----------------------------------------------------------------------------- step 2


@dataclass
class CapeEmbedding:
    """A fitted embedding: hyperboloid points ``p`` [M,n+1], Poincare points ``e`` [M,n], angles ``phi``
    [M,n], and the loss per step."""

    p: Tensor
    e: Tensor
    phi: Tensor
    losses: list = field(default_factory=list)


def cape_loss(
    p: Float[Tensor, "M n1"], W: Float[Tensor, "M M"], pi: Float[Tensor, " M"], lambda_g: float
) -> Float[Tensor, ""]:
    """``(1/M) sum_v L_con(v) + lambda_g sum_v pi_v d_L^2(p_v, o)`` (see the module docstring)."""
    D = sq_lorentz(p.unsqueeze(1), p.unsqueeze(0))  # [M,M]
    return contrastive_loss(D, W, pi, 2 * (p[:, 0] - 1), lambda_g)  # d_L^2(p, o) = 2 (p_0 - 1)


def contrastive_loss(
    D: Float[Tensor, "M M"],
    W: Float[Tensor, "M M"],
    pi: Float[Tensor, " M"],
    to_origin: Float[Tensor, " M"],
    lambda_g: float,
) -> Float[Tensor, ""]:
    """The step-2 loss for any geometry, from the squared distances ``D`` between points and ``to_origin``
    of each point to the origin: an InfoNCE on ``exp(-D)`` with positives weighted by ``W`` (k-hop weights)
    and negatives where ``W = 0``, averaged over anchors, plus ``lambda_g sum_v pi_v to_origin_v``."""
    M = D.shape[0]
    eye = torch.eye(M, dtype=torch.bool)
    negative = (W == 0) & ~eye
    # log of sum over negatives of exp(-d), per anchor; -inf when the anchor has none.
    neg_lse = torch.logsumexp(torch.where(negative, -D, -torch.inf), 1, keepdim=True)
    log_ratio = -D - torch.logaddexp(-D, neg_lse)  # log e^{-D_ij} / (e^{-D_ij} + sum_neg e^{-D_il})
    total = W.sum(1, keepdim=True)
    con = -(torch.where(W > 0, W * log_ratio, 0.0) / total.clamp_min(1e-300)).sum(1)
    return con.mean() + lambda_g * (pi * to_origin).sum()


def initial_points(M: int, dim: int, seed: int = 0, scale: float = 1e-2) -> Float[Tensor, "M dim"]:
    """``embed``'s default start: spatial coordinates ``scale * N(0, I)`` from ``seed``."""
    return scale * torch.randn(M, dim, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def embed(
    A,
    dim: int = 4,
    k: int = 2,
    lambda_g: float = 1.0,
    steps: int = 300,
    lr: float = 0.1,
    init_scale: float = 1e-2,
    seed: int = 0,
    init: Float[Tensor, "M n"] | None = None,
) -> CapeEmbedding:
    """Fit the hyperbolic embedding of DAG ``A`` [M,M] by full-batch Riemannian SGD from spatial
    coordinates ``init`` [M,dim] (default ``init_scale * N(0, I)`` from ``seed``). The algorithm is
    permutation equivariant: embedding ``A[perm][:, perm]`` from ``init[perm]`` gives ``p[perm]``."""
    A = check_dag(A)
    M = A.shape[0]
    if dim < 1 or steps < 0 or lr <= 0 or lambda_g < 0:
        raise ValueError(
            f"need dim >= 1, steps >= 0, lr > 0, lambda_g >= 0; got dim={dim}, steps={steps}, lr={lr}, lambda_g={lambda_g}"
        )
    if init is None:
        init = initial_points(M, dim, seed, init_scale)
    init = torch.as_tensor(init, dtype=torch.float64)
    if init.shape != (M, dim):
        raise ValueError(f"init must have shape ({M}, {dim}), got {tuple(init.shape)}")
    W, pi = hop_weights(A, k), generality(A)
    p = lift(init)
    losses = []
    for _ in range(steps):
        p.requires_grad_(True)
        loss = cape_loss(p, W, pi, lambda_g)
        (g,) = torch.autograd.grad(loss, p)
        losses.append(loss.item())
        with torch.no_grad():
            v = -lr * riemannian_grad(p, g)
            norm = minkowski_dot(v, v).clamp_min(0).sqrt().unsqueeze(-1)
            v = v * (1.0 / norm.clamp_min(1.0))  # cap a step at geodesic length 1
            p = lift(expmap(p, v)[:, 1:])  # reproject against round-off
    p = p.detach()
    e = to_poincare(p)
    return CapeEmbedding(p, e, angles(e), losses)


# ----------------------------------------------------------------------------- synthetic DAGs with known truth


def random_tree(M: int, generator: torch.Generator, weights: tuple[float, float] = (0.5, 1.5)) -> Tensor:
    """A random recursive tree on M nodes (parent of v uniform on 0..v-1, as ``MarkovTreeTask``), edge
    weights uniform in ``weights`` with random sign; node 0 is the root. Returns ``A`` [M,M]."""
    A = torch.zeros(M, M, dtype=torch.float64)
    for v in range(1, M):
        u = int(torch.randint(v, (1,), generator=generator))
        A[u, v] = _weight(weights, generator)
    return A


def random_dag(M: int, generator: torch.Generator, edge_prob: float = 0.2, weights=(0.5, 1.5)) -> Tensor:
    """A random DAG in topological order 0..M-1: a random recursive tree (so it is connected) plus each
    other forward edge ``i -> j`` (i < j) with probability ``edge_prob``. Returns ``A`` [M,M]."""
    A = random_tree(M, generator, weights)
    extra = torch.rand(M, M, dtype=torch.float64, generator=generator) < edge_prob
    for i, j in torch.nonzero(torch.triu(extra, 1) & (A == 0)).tolist():
        A[i, j] = _weight(weights, generator)
    return A


def _weight(weights, generator) -> float:
    lo, hi = weights
    w = lo + (hi - lo) * float(torch.rand((), dtype=torch.float64, generator=generator))
    return w if float(torch.rand((), generator=generator)) < 0.5 else -w


def depth(A) -> Float[np.ndarray, " M"]:
    """Longest directed path from any root to each node (roots: 0)."""
    adj = np.asarray(A) != 0
    M = adj.shape[0]
    d = np.zeros(M)
    for _ in range(M):
        d = np.maximum(d, np.where(adj, d[:, None] + 1, 0).max(0))
    return d
