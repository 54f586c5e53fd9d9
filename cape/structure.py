"""CAPE step 1 (arXiv 2509.16629): causal structure learning from a data matrix, on this suite's tasks.

The structural-equation model is CAPE's VAE form ``Z = f(X)(I - A)``, ``X = f^{-1}(Z (I - A)^{-1})`` with a
deterministic encoder and a unit-variance Gaussian prior on Z, for which the negative ELBO is
``||Z||^2 / 2N`` up to constants. Nodes may carry vectors (``X [N, M, d]``). Two encoders ``f``:

- ``f='linear'``: the identity (after standardising), the paper's simplest case: ``x_j = sum_i x_i W_ij + z_j``
  with one ``d x d`` block per edge.
- ``f='mlp'``: ``f_j(x) = [x, m_j(x)]``, the node's own value next to ``extra`` learned features ``m_j`` (a
  per-node one-hidden-layer tanh MLP, batch-standardised to total variance 1 so they cannot shrink Z by
  scaling). The SEM is linear in these features, so an edge can act through a non-monotone function of the
  parent (``x_j = x_i^2 + z`` is ``x_j`` regressed on ``m_i(x_i) ~ x_i^2``), which the linear f cannot see
  (x_i and x_i^2 are uncorrelated). ``f^{-1}`` is the projection on the first d coordinates: it inverts f
  exactly on its image, so the decoder reconstructs X exactly, as in the linear case, and the reconstruction
  term of the ELBO vanishes. With ``extra = 0`` the objective is the linear one. (The paper's f is an MLP
  with a learned decoder; this exactly invertible form is our choice, and it contains the linear model.)

The edge weight is the Frobenius norm of the edge's block, ``A_ij = ||W_ij||_F`` (for the linear f and d = 1
the signed scalar ``W_ij``). The loss

    ||Z||^2 / 2N  +  lambda ||A||_1  +  rho/2 h(A)^2  +  alpha h(A),   h(A) = tr(exp(A o A)) - M,

is minimised by the augmented Lagrangian (outer loop on rho and alpha). The inner solver is L-BFGS by
default (as in NOTEARS): with Adam (``optimizer='adam'``, the paper's choice) we measured recovery on the
continuous task at N = 50..200 coming and going with lambda and the step count (0 to 11 edges kept; once
at rho ~ 1e6 every edge shrank below tau); L-BFGS gave the same result for 50 or 100 iterations. Edges with
``|A_ij| < tau`` are pruned; any cycle left is broken by dropping its weakest edge.

Identifiability: a tree has no v-structure, so its Markov equivalence class is every orientation of its
skeleton; from observational data only the skeleton is identified in general. Orientation metrics are
reported but are expected to be weak; the skeleton metrics are the ones to judge.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from probes.continuous import ContinuousTask
from probes.tasks import MarkovTreeTask

EPS = 1e-12  # inside the group norm's square root, so its gradient exists at W_ij = 0


def acyclicity(A: Float[Tensor, "M M"]) -> Tensor:
    """``h(A) = tr(exp(A o A)) - M``: 0 exactly when the weighted graph A has no directed cycle, > 0 else."""
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"A must be a square M x M matrix, got shape {tuple(A.shape)}")
    return torch.linalg.matrix_exp(A * A).diagonal().sum() - A.shape[0]


@dataclass
class StructureConfig:
    """Solver settings; the defaults suit M = 8..12 standardised features and N up to a few thousand."""

    lambda1: float = 0.05  # L1 (group) penalty on A
    tau: float = 0.3  # prune edges with |A| < tau
    optimizer: str = "lbfgs"  # inner solver: 'lbfgs' (reliable) or 'adam' (the paper's; see the module note)
    lr: float = 0.02  # inner Adam step
    inner_steps: int = 50  # optimiser iterations per augmented-Lagrangian subproblem
    max_outer: int = 12  # outer iterations (rho / alpha updates)
    h_tol: float = 1e-5  # stop when h(A) is below this (threshold + break_cycles make A exactly acyclic)
    rho_max: float = 1e6  # beyond this Adam oscillates and shrinks every edge to 0
    seed: int = 0  # initial weights ~ N(0, init^2) from this seed
    init: float = 0.1  # breaks the i->j / j->i symmetry of an unorientable edge
    f: str = "linear"  # the encoder: 'linear' (identity) or 'mlp' (x next to learned features; module note)
    extra: int = 2  # f='mlp': learned features per node
    hidden: int = 16  # f='mlp': hidden units of each node's MLP


def edge_weights(W: Float[Tensor, "M M k k"], signed: bool = False) -> Float[Tensor, "M M"]:
    """``A_ij``: the signed scalar when ``signed`` (1 x 1 blocks), else the smoothed Frobenius norm of ``W_ij``."""
    if signed:
        return W[..., 0, 0]
    return (W.pow(2).sum((-1, -2)) + EPS).sqrt()


class NodeEncoder(torch.nn.Module):
    """``f``: ``[N, M, d] -> [N, M, d + extra]``, each node's value next to its own ``extra`` learned tanh-MLP
    features, batch-standardised to total variance 1 per node (``extra = 0``: the identity)."""

    def __init__(self, M: int, d: int, extra: int, hidden: int, generator: torch.Generator):
        super().__init__()
        self.extra = extra
        if extra == 0:
            return

        def init(*shape, fan_in):
            return torch.nn.Parameter(torch.randn(*shape, dtype=torch.float64, generator=generator) / fan_in**0.5)

        self.W1, self.b1 = init(M, d, hidden, fan_in=d), init(M, hidden, fan_in=1)
        self.W2 = init(M, hidden, extra, fan_in=hidden)

    def forward(self, X: Float[Tensor, "N M d"]) -> Float[Tensor, "N M k"]:
        if self.extra == 0:
            return X
        m = torch.einsum("nmh,mhe->nme", torch.tanh(torch.einsum("nmd,mdh->nmh", X, self.W1) + self.b1), self.W2)
        m = m - m.mean(0)
        return torch.cat([X, m / (m.pow(2).sum(-1).mean(0).sqrt()[None, :, None] + 1e-8)], -1)


def _check_data(X: Tensor) -> Float[Tensor, "N M d"]:
    X = torch.as_tensor(X)
    if X.ndim == 2:
        X = X.unsqueeze(-1)
    if X.ndim != 3 or X.shape[0] < 2 or X.shape[1] < 2:
        raise ValueError(f"X must be [N, M] or [N, M, d] with N >= 2 samples and M >= 2 features, got {tuple(X.shape)}")
    if not X.dtype.is_floating_point:
        X = X.double()
    if not torch.isfinite(X).all():
        raise ValueError("X contains NaN or Inf; expected finite data")
    return X.double()


def standardise(X: Float[Tensor, "N M d"]) -> Float[Tensor, "N M d"]:
    """Centre every coordinate; scale each node so its vector has total variance 1 (constant nodes stay 0)."""
    Xc = X - X.mean(0)
    scale = Xc.pow(2).sum(-1).mean(0).sqrt().clamp_min(1e-12)  # [M]
    return Xc / scale[None, :, None]


def learn_structure(X: Tensor, config: StructureConfig | None = None) -> dict:
    """Learn a weighted DAG from ``X`` ([N, M] scalars or [N, M, d] vectors per node).

    Returns ``A`` [M, M] float64 (thresholded, acyclic; ``A[i, j] != 0``: edge i -> j), ``A_raw`` (before
    the threshold), ``h`` (acyclicity of A_raw), ``loss`` (final least-squares term) and ``outer`` (outer
    iterations run). Deterministic for a given ``config.seed`` on CPU.
    """
    cfg = config or StructureConfig()
    if cfg.tau < 0 or cfg.lambda1 < 0 or cfg.inner_steps < 1 or cfg.max_outer < 1:
        raise ValueError("need tau >= 0, lambda1 >= 0, inner_steps >= 1 and max_outer >= 1")
    if cfg.f not in ("linear", "mlp") or cfg.extra < 0 or cfg.hidden < 1:
        raise ValueError(
            f"need f in ('linear', 'mlp'), extra >= 0 and hidden >= 1; got {cfg.f!r}, {cfg.extra}, {cfg.hidden}"
        )
    X = standardise(_check_data(X))
    N, M, d = X.shape
    g = torch.Generator().manual_seed(cfg.seed)
    extra = cfg.extra if cfg.f == "mlp" else 0
    W = (cfg.init * torch.randn(M, M, d + extra, d + extra, dtype=torch.float64, generator=g)).requires_grad_()
    encoder = NodeEncoder(M, d, extra, cfg.hidden, g)
    params = [W, *encoder.parameters()]
    eye = torch.eye(M, dtype=torch.float64)
    off_diag = (1 - eye)[:, :, None, None]
    signed = cfg.f == "linear" and d == 1
    rho, alpha, h_prev = 1.0, 0.0, float("inf")

    def weighted_graph() -> Tensor:
        return edge_weights(W * off_diag, signed) * (1 - eye)

    def residual_and_A() -> tuple[Tensor, Tensor]:
        F = encoder(X)  # [N, M, k]
        return F - torch.einsum("nik,ijkl->njl", F, W * off_diag), weighted_graph()  # Z = f(X)(I - A)

    def objective(rho: float, alpha: float) -> Tensor:
        Z, A = residual_and_A()
        h = acyclicity(A)
        l1 = (A * A + EPS).sqrt().sum()  # smoothed |A| so that L-BFGS sees a differentiable objective
        return 0.5 * Z.pow(2).sum() / N + cfg.lambda1 * l1 + 0.5 * rho * h * h + alpha * h

    def fit(rho: float, alpha: float) -> float:
        if cfg.optimizer == "adam":
            opt = torch.optim.Adam(params, lr=cfg.lr)
            for _ in range(cfg.inner_steps):
                opt.zero_grad()
                objective(rho, alpha).backward()
                opt.step()
        else:
            opt = torch.optim.LBFGS(
                params, max_iter=cfg.inner_steps, line_search_fn="strong_wolfe", tolerance_grad=1e-9
            )

            def closure():
                opt.zero_grad()
                loss = objective(rho, alpha)
                loss.backward()
                return loss

            opt.step(closure)
        with torch.no_grad():
            return acyclicity(weighted_graph()).item()

    outer = 0
    for outer in range(1, cfg.max_outer + 1):
        h = fit(rho, alpha)
        while h > 0.25 * h_prev and rho < cfg.rho_max:  # not enough progress: stiffen the penalty
            rho *= 10
            h = fit(rho, alpha)
        alpha += rho * h
        h_prev = h
        if h <= cfg.h_tol or rho >= cfg.rho_max:
            break
    with torch.no_grad():
        Z, A_raw = residual_and_A()
        loss = 0.5 * Z.pow(2).sum().item() / N
    A = A_raw.clone()
    A[A.abs() < cfg.tau] = 0
    A = break_cycles(A)
    return {"A": A, "A_raw": A_raw, "h": acyclicity(A_raw).item(), "loss": loss, "outer": outer}


def break_cycles(A: Float[Tensor, "M M"]) -> Float[Tensor, "M M"]:
    """Drop the weakest remaining edge until A is acyclic (a no-op on a DAG)."""
    A = A.clone()
    while _has_cycle(A != 0):
        nz = (A != 0).nonzero()
        weakest = A[nz[:, 0], nz[:, 1]].abs().argmin()
        A[nz[weakest, 0], nz[weakest, 1]] = 0
    return A


def _has_cycle(adj: Tensor) -> bool:
    """Kahn's algorithm on a boolean adjacency matrix."""
    indeg = adj.sum(0).tolist()
    ready = [j for j, k in enumerate(indeg) if k == 0]
    seen = 0
    while ready:
        i = ready.pop()
        seen += 1
        for j in adj[i].nonzero().flatten().tolist():
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    return seen < adj.shape[0]


def tree_adjacency(parents: Int[Tensor, " M"]) -> Tensor:
    """Boolean [M, M] adjacency of a tree given as parents (``-1`` for the root): ``adj[pa(j), j]``."""
    parents = torch.as_tensor(parents).long()
    M = parents.numel()
    adj = torch.zeros(M, M, dtype=torch.bool)
    for j, p in enumerate(parents.tolist()):
        if p >= 0:
            adj[p, j] = True
    return adj


def shd(A: Tensor, true_adj: Tensor) -> int:
    """Structural Hamming distance: missing + extra edges, a reversed edge counted once."""
    est, true = A != 0, true_adj.bool()
    est_sk, true_sk = est | est.T, true | true.T
    iu = torch.triu_indices(A.shape[0], A.shape[0], 1)
    skeleton_diff = (est_sk != true_sk)[iu[0], iu[1]].sum().item()
    reversed_ = ((est & ~true) & (true.T & ~est.T)).sum().item()  # present in both skeletons, wrong way
    return int(skeleton_diff + reversed_)


def skeleton_f1(A: Tensor, true_adj: Tensor) -> float:
    """F1 of the undirected edge sets (1 when the skeletons agree; 0 when none of the true edges is found)."""
    iu = torch.triu_indices(A.shape[0], A.shape[0], 1)
    est = ((A != 0) | (A != 0).T)[iu[0], iu[1]]
    true = (true_adj.bool() | true_adj.bool().T)[iu[0], iu[1]]
    tp = (est & true).sum().item()
    if tp == 0:
        return 0.0
    precision, recall = tp / est.sum().item(), tp / true.sum().item()
    return 2 * precision * recall / (precision + recall)


def dag_parents(A: Tensor) -> Int[Tensor, " M"]:
    """Each node's parent as learned: the incoming edge of largest |A| (-1 when it has none)."""
    w = A.abs().clone()
    best = w.argmax(0)
    return torch.where(w.max(0).values > 0, best, torch.full_like(best, -1))


def ordered_parents(A: Tensor) -> Int[Tensor, " M"]:
    """Parents when the order is known (as BMA's prior pa(h) < h knows it): for j >= 1 the i < j of largest
    skeleton weight ``|A_ij| + |A_ji|`` (-1 when none is non-zero). Orientation is then given, not learned."""
    w = A.abs() + A.abs().T
    w = w.masked_fill(~torch.ones_like(w, dtype=torch.bool).tril(-1).T, 0)  # keep i < j at [i, j]
    best = w.argmax(0)
    out = torch.where(w.max(0).values > 0, best, torch.full_like(best, -1))
    out[0] = -1
    return out


def parent_accuracy_tree(estimated: Int[Tensor, " M"], parents: Int[Tensor, " M"]) -> float:
    """Fraction of non-root nodes whose estimated parent is the true one."""
    parents = torch.as_tensor(parents).long()
    keep = parents >= 0
    return (estimated[keep] == parents[keep]).double().mean().item()


def structure_metrics(A: Tensor, parents: Int[Tensor, " M"]) -> dict:
    """SHD, skeleton F1, parent accuracy (learned orientation) and ordered parent accuracy against a tree."""
    true = tree_adjacency(parents)
    return {
        "shd": shd(A, true),
        "skeleton_f1": skeleton_f1(A, true),
        "parent_accuracy": parent_accuracy_tree(dag_parents(A), parents),
        "ordered_parent_accuracy": parent_accuracy_tree(ordered_parents(A), parents),
        "n_edges": int((A != 0).sum().item()),
    }


def markov_tree_data(task, parents: Int[Tensor, " H"], n: int, seed: int) -> Float[Tensor, "n H d"]:
    """``n`` i.i.d. sequences of the Markov-tree task on ONE fixed tree, one-hot encoded: [n, H, d]."""
    one_tree = MarkovTreeTask(task.pi, n - 1, task.seq_len, task.root)  # n sequences in one context
    tokens, _ = one_tree.sample(1, torch.Generator().manual_seed(seed), parents=parents.view(1, -1))
    return torch.nn.functional.one_hot(tokens.view(n, task.seq_len), task.d_vocab).double()


def continuous_data(task, parents: Int[Tensor, " H"], n: int, seed: int) -> Float[Tensor, "n H d"]:
    """``n`` i.i.d. sequences of the continuous task (``probes.continuous``) on one fixed tree: [n, H, d]."""
    one_tree = ContinuousTask(task.A, task.rho, n - 1, task.seq_len)
    x, _ = one_tree.sample(1, torch.Generator().manual_seed(seed), parents=parents.view(1, -1))
    return x.view(n, task.seq_len, task.d_vocab)


def nonlinear_tree_data(
    parents: Int[Tensor, " M"], n: int, seed: int, rho: float = 0.8, quadratic: float = 0.5
) -> Float[Tensor, "n M 1"]:
    """``n`` samples of a scalar SEM on the tree ``parents``: ``x_root ~ N(0, 1)``,
    ``x_j = rho std(q_j(x_pa)) + sqrt(1 - rho^2) eta`` where ``q_j`` is the identity or, for a fraction
    ``quadratic`` of the edges (drawn from ``seed``), the square (``std`` standardises over the n samples).
    A squared Gaussian parent is uncorrelated with it, so a linear f cannot see those edges."""
    parents = torch.as_tensor(parents).long()
    if not 0 < rho < 1 or not 0 <= quadratic <= 1 or n < 2:
        raise ValueError(f"need 0 < rho < 1, 0 <= quadratic <= 1 and n >= 2; got {rho}, {quadratic}, {n}")
    g = torch.Generator().manual_seed(seed)
    M = parents.numel()
    squared = torch.rand(M, generator=g, dtype=torch.float64) < quadratic
    x = torch.randn(n, M, dtype=torch.float64, generator=g)
    for j, p in enumerate(parents.tolist()):
        if p >= 0:
            u = x[:, p] ** 2 if squared[j] else x[:, p]
            x[:, j] = rho * (u - u.mean()) / u.std() + (1 - rho**2) ** 0.5 * x[:, j]
    return x.unsqueeze(-1)
