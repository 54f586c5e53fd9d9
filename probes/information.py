"""Exact information quantities on one causal tree (Lemmas 2 to 4 of docs/paper.md section 4), no sampling.

Everything is computed in float64 from the kernel ``pi[a, b] = pi(b | a)``, the root distribution and
a tree ``parents`` (0-based, ``parents[0] = -1``, ``parents[h] < h``):

- marginals by propagating the root distribution down the tree, ``P(x_h) = P(x_pa(h)) @ pi``;
- the joint of two nodes through their lowest common ancestor c, m and n edges above them:
  ``P(x_h = a, x_g = b) = sum_s P(x_c = s) (pi^m)[s, a] (pi^n)[s, b]``;
- mutual information (nats) and chi-square mutual information of each pair.

Lemma 3 here. With ``gamma = d * min pi`` (the kernel floor) and ``delta = min_{v, s} P(x_v = s)``
(the smallest marginal probability of any node), every non-parent h' of h satisfies
``I(x_h; x_h') <= eta * I(x_h; x_pa(h))`` with ``eta <= 1 - delta * gamma``. Proof: x_h - x_pa(h) - x_h'
is a Markov chain (h' < h is a non-descendant of h), so the strong DPI gives eta = eta_KL of the
channel K(b | a) = P(x_h' = b | x_pa(h) = a), and eta_KL <= eta_TV (Dobrushin) <= 1 - sum_b min_a K(b|a).
If the tree path from pa(h) to h' ends with a downward edge, K(b|a) >= gamma / d, so eta_TV <= 1 - gamma.
Otherwise h' is an ancestor of pa(h): by Bayes K(b|a) = P(x_h'=b) (pi^m)[b, a] / P(x_pa=a) >= delta gamma / d,
so eta_TV <= 1 - delta gamma. Both are <= 1 - delta gamma (delta <= 1/d). ``dobrushin`` computes the middle
term exactly, so the chain measured ratio <= eta_TV <= 1 - delta gamma can be checked link by link.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor

from probes.tasks import check_distribution, check_kernel


def check_tree(parents: Tensor) -> list[int]:
    """Validate one tree (``parents[0] = -1``, ``0 <= parents[h] < h``); return it as a list."""
    p = [int(v) for v in torch.as_tensor(parents).flatten().tolist()]
    if len(p) < 1 or p[0] != -1 or any(not 0 <= p[h] < h for h in range(1, len(p))):
        raise ValueError(f"parents must be one tree with parents[0] = -1 and 0 <= parents[h] < h, got {p}")
    return p


def lca_and_depths(parents: Tensor) -> tuple[Int[Tensor, "H H"], Int[Tensor, "H H"], Int[Tensor, "H H"]]:
    """``(lca, m, n)``: the lowest common ancestor c of every pair (h, g), the number of edges from c
    down to h (``m[h, g]``) and from c down to g (``n[h, g]``)."""
    p = check_tree(parents)
    H = len(p)
    above = torch.eye(H, dtype=torch.bool)  # above[h, v]: v is h or an ancestor of h
    depth = torch.zeros(H, dtype=torch.long)
    for h in range(1, H):
        above[h] |= above[p[h]]
        depth[h] = depth[p[h]] + 1
    # Common ancestors form a chain from the root; the deepest has the largest index (parents[h] < h).
    common = above.unsqueeze(1) & above.unsqueeze(0)  # [h, g, v]
    lca = (common * torch.arange(H)).argmax(-1)
    return lca, depth.unsqueeze(1) - depth[lca], depth.unsqueeze(0) - depth[lca]


def tree_distance(parents: Tensor) -> Int[Tensor, "H H"]:
    """Number of edges on the (undirected) tree path between every pair of nodes."""
    _, m, n = lca_and_depths(parents)
    return m + n


def node_marginals(pi: Float[Tensor, "d d"], root: Float[Tensor, " d"], parents: Tensor) -> Float[Tensor, "H d"]:
    """``P(x_h = s)`` for every node, by propagating the root distribution down the tree."""
    pi = check_kernel(pi)
    root = check_distribution(root, pi.shape[0])
    p = check_tree(parents)
    marg = torch.empty(len(p), pi.shape[0], dtype=torch.float64)
    marg[0] = root
    for h in range(1, len(p)):
        marg[h] = marg[p[h]] @ pi
    return marg


def pair_joints(pi: Float[Tensor, "d d"], root: Float[Tensor, " d"], parents: Tensor) -> Float[Tensor, "H H d d"]:
    """``joint[h, g, a, b] = P(x_h = a, x_g = b)`` for every pair, through their lowest common ancestor
    (the diagonal ``joint[h, h]`` is ``diag(P(x_h))``)."""
    pi = check_kernel(pi)
    marg = node_marginals(pi, root, parents)
    lca, m, n = lca_and_depths(parents)
    H, d = marg.shape
    powers = [torch.eye(d, dtype=torch.float64)]
    for _ in range(H):
        powers.append(powers[-1] @ pi)
    powers = torch.stack(powers)  # [H+1, d, d]: pi^0 .. pi^H
    joint = torch.einsum("hgsa,hgs,hgsb->hgab", powers[m], marg[lca], powers[n])
    return joint


def mutual_information(joint: Float[Tensor, "... d d"]) -> Float[Tensor, "..."]:
    """``I(X; Y)`` in nats from joint tables over the last two axes (0 log 0 = 0)."""
    joint = joint.double()
    indep = joint.sum(-1, keepdim=True) * joint.sum(-2, keepdim=True)
    terms = torch.where(joint > 0, joint * (joint / torch.where(joint > 0, indep, 1.0)).log(), 0.0)
    return terms.sum((-1, -2))


def chi2_mutual_information(joint: Float[Tensor, "... d d"]) -> Float[Tensor, "..."]:
    """Chi-square mutual information ``sum P(a,b)^2 / (P(a) P(b)) - 1`` (zero-probability rows skipped)."""
    joint = joint.double()
    indep = joint.sum(-1, keepdim=True) * joint.sum(-2, keepdim=True)
    return torch.where(indep > 0, joint**2 / torch.where(indep > 0, indep, 1.0), 0.0).sum((-1, -2)) - 1


def kernel_floor(pi: Float[Tensor, "d d"]) -> float:
    """The largest gamma with ``pi >= gamma / d`` (Lemma 3's minorisation constant)."""
    pi = check_kernel(pi)
    return pi.shape[0] * pi.min().item()


def dobrushin(channel: Float[Tensor, "... a b"]) -> Float[Tensor, "..."]:
    """Dobrushin coefficient ``max_{a, a'} TV(K(.|a), K(.|a'))`` of row-stochastic channels."""
    return 0.5 * (channel.unsqueeze(-2) - channel.unsqueeze(-3)).abs().sum(-1).amax((-1, -2))


def sdpi_report(pi: Float[Tensor, "d d"], root: Float[Tensor, " d"], parents: Tensor) -> dict:
    """Lemmas 2 and 3 on one tree, every h >= 2 (nodes with at least one non-parent candidate).

    Returns per node h: ``ratio`` = max over non-parents h' < h of ``I(x_h; x_h') / I(x_h; x_pa(h))``,
    ``dobrushin`` = max over the same h' of the Dobrushin coefficient of ``P(x_h' | x_pa(h))`` (the
    SDPI constant the proof uses), and the tree-wide ``bound`` = 1 - delta gamma, ``delta``, ``gamma``;
    plus ``dpi_slack`` = min over all (h, h' != pa) of ``I(x_h; x_pa(h)) - I(x_h; x_h')`` (>= 0 by DPI).
    """
    pa = torch.tensor(check_tree(parents))
    H = len(pa)
    joint = pair_joints(pi, root, parents)
    mi = mutual_information(joint)
    marg = joint.diagonal(dim1=2, dim2=3).diagonal(dim1=0, dim2=1).T  # [H, d]: P(x_h = s)
    gamma, delta = kernel_floor(pi), marg.min().item()
    rows = torch.arange(2, H)
    cand = torch.ones(H, H, dtype=torch.bool).tril(-1)
    cand[torch.arange(1, H), pa[1:]] = False  # non-parents h' < h
    cand = cand[rows]
    mi_pa = mi[rows, pa[rows]].unsqueeze(1)
    ratio = torch.where(cand, mi[rows] / mi_pa, -torch.inf).amax(-1)
    channel = joint[pa[rows]] / marg[pa[rows]].view(-1, 1, marg.shape[1], 1)  # [h, g, a, b] = P(x_g=b | x_pa(h)=a)
    dob = torch.where(cand, dobrushin(channel), -torch.inf).amax(-1)
    slack = torch.where(cand, mi_pa - mi[rows], torch.inf).min().item() if H > 2 else float("inf")
    return {
        "ratio": dict(zip(rows.tolist(), ratio.tolist())),
        "dobrushin": dict(zip(rows.tolist(), dob.tolist())),
        "bound": 1 - delta * gamma,
        "delta": delta,
        "gamma": gamma,
        "dpi_slack": slack,
    }


def expected_log_likelihood(
    pi: Float[Tensor, "d d"], root: Float[Tensor, " d"], parents: Tensor
) -> Float[Tensor, "H H"]:
    """Lemma 4: ``E[log pi(x_h | x_h')]`` at [h, h'] for h' < h, exactly; -inf elsewhere. This is the
    expected per-demonstration BMA score of candidate h', so its argmax over h' should be pa(h)."""
    joint = pair_joints(pi, root, parents)  # [h, g, a, b] = P(x_h = a, x_g = b)
    log_pi = check_kernel(pi).log()  # log_pi[b, a] = log pi(a | b)
    ell = torch.where(joint > 0, joint * log_pi.T, 0.0).sum((-1, -2))
    H = ell.shape[0]
    return ell.masked_fill(~torch.ones(H, H, dtype=torch.bool).tril(-1), float("-inf"))
