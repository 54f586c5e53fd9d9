"""Measurements shared by training, the analyses and the tests.

Conventions: attention/posterior tensors are ``[batch, H, H]`` (query h, key h'); row 0 has no
candidates and is excluded from every average, as is everything at positions h = 0 for NLL.
"""

from __future__ import annotations

from jaxtyping import Float, Int
from torch import Tensor


def total_variation(p: Float[Tensor, "batch H H"], q: Float[Tensor, "batch H H"]) -> Float[Tensor, "batch H"]:
    """TV distance 0.5 * sum_h' |p - q| per (context, query position).

    Args:
        p: attention or posterior rows ``[batch, H, H]``, query h first, candidate parent h' second.
        q: the same shape (e.g. ``probes.bma_posterior``).

    Returns:
        ``[batch, H]``: the TV distance of each row.
    """
    return 0.5 * (p.double() - q.double()).abs().sum(-1)


def mean_tv(p: Float[Tensor, "batch H H"], q: Float[Tensor, "batch H H"]) -> float:
    """Mean TV over contexts and query positions h >= 1 (row 0, the root, has no candidate parent).

    Args:
        p: attention or posterior rows ``[batch, H, H]``, query h first, candidate parent h' second.
        q: the same shape (e.g. ``probes.bma_posterior``).

    Returns:
        The mean TV distance, in [0, 1].
    """
    return total_variation(p, q)[:, 1:].mean().item()


def parent_hits(attention: Float[Tensor, "batch H H"], parents: Int[Tensor, "batch H"]) -> Float[Tensor, "batch H-1"]:
    """1 where the most-attended candidate is the true parent, for h >= 1."""
    return (attention[:, 1:].argmax(-1) == parents[:, 1:].to(attention.device)).double()


def parent_accuracy(attention: Float[Tensor, "batch H H"], parents: Int[Tensor, "batch H"]) -> float:
    """Fraction of (context, h >= 1) where the argmax of the attention is the true parent.

    Args:
        attention: rows ``[batch, H, H]`` over the candidate parents (attention, or a posterior).
        parents: the true parents ``[batch, H]`` (``task.sample``'s second output; -1 for the root).

    Returns:
        The accuracy, in [0, 1].
    """
    if attention.isnan().any():
        raise ValueError("attention holds NaN: no argmax to score; expected rows of finite weights")
    return parent_hits(attention, parents).mean().item()


def dag_parent_mass(attention: Float[Tensor, "T T"], parents: list[list[int]]) -> float | None:
    """Nichani et al.'s measure of a fixed graph (``many_graphs.ipynb``): the mass a ``[query, key]`` attention
    puts from each position i with exactly one parent on that parent p(i), averaged over those positions
    (their ``1 - sum(deltas) / n_edges``); positions beyond the attention's T rows are left out. None: no edge."""
    T = attention.shape[0]
    edges = [(i, ps[0]) for i, ps in enumerate(parents[:T]) if len(ps) == 1]
    return sum(attention[i, p].item() for i, p in edges) / len(edges) if edges else None


def parent_set_accuracy(attention: Float[Tensor, "batch H H"], parents: Int[Tensor, "batch H *P"]) -> float:
    """Fraction of (context, h >= 1 with a parent) where the argmax of the attention is one of h's parents;
    ``parents`` ``[batch, H]`` or ``[batch, H, P]``, -1 for none. ``parent_accuracy`` on a tree."""
    parents = parents.to(attention.device)
    parents = parents.unsqueeze(-1) if parents.ndim == 2 else parents
    best = attention[:, 1:].argmax(-1, keepdim=True)  # [batch, H-1, 1]
    hit = (best == parents[:, 1:]).any(-1)
    has = (parents[:, 1:] >= 0).any(-1)
    return (hit & has).double().sum().item() / max(int(has.sum()), 1)


POSITIONS = ("all", "last")  # the target positions an NLL averages over: every h >= 1, or the last one only


def scored_rows(H: int, positions: str = "all") -> slice:
    """The rows of ``[batch, H, d]`` log-probabilities an NLL averages over: ``all`` h >= 1 (row 0, the root,
    has nothing to predict it from), or ``last`` (h = H - 1: the loss of a model trained on the last token)."""
    if positions not in POSITIONS:
        raise ValueError(f"positions {positions!r}: expected one of {', '.join(POSITIONS)}")
    return slice(1, None) if positions == "all" else slice(H - 1, None)


def target_nll(log_probs: Float[Tensor, "batch H d"], tokens: Int[Tensor, "batch T"], positions: str = "all") -> float:
    """Mean negative log-likelihood (nats) of the target tokens x_h at ``positions``.

    Args:
        log_probs: the model's log-probabilities of the target tokens ``[batch, H, d]`` (``Subject.log_probs``).
        tokens: the contexts ``[batch, (L+1)*H]`` they were computed on; the target is the last H.
        positions: ``all`` (every h >= 1) or ``last`` (h = H - 1 only): ``scored_rows``.

    Returns:
        The mean NLL in nats over contexts and those positions (x_0, the root, is always left out).
    """
    batch, H, d = log_probs.shape
    if tokens.dim() != 2 or tokens.shape[0] != batch or tokens.shape[1] < H or tokens.shape[1] % H:
        raise ValueError(f"tokens must be the contexts the log-probs were computed on, [{batch}, (L+1)*{H}]; got "
                         f"shape {tuple(tokens.shape)}")  # fmt: skip
    target = tokens[:, -H:].to(log_probs.device)
    if target.min() < 0 or target.max() >= d:
        raise ValueError(f"the target tokens must be ids in [0, {d}) (the log-probs' columns); got values in "
                         f"[{target.min().item()}, {target.max().item()}]")  # fmt: skip
    return -log_probs.double().gather(-1, target.unsqueeze(-1))[:, scored_rows(H, positions)].mean().item()


def last_token_nll(log_probs: Float[Tensor, "batch H d"], tokens: Int[Tensor, "batch T"]) -> float:
    """Mean NLL (nats) of the context's last token, the target's x_{H-1}, under ``log_probs``' last row."""
    return -log_probs[:, -1].double().gather(-1, tokens[:, -1:].to(log_probs.device)).mean().item()


def per_context_nll(
    log_probs: Float[Tensor, "batch H d"], tokens: Int[Tensor, "batch T"], positions: str = "all"
) -> Float[Tensor, " batch"]:
    """Target NLL of each context (at ``positions``, as ``target_nll``: x_1..x_{H-1}), float64, differentiable."""
    H = log_probs.shape[1]
    target = tokens[:, -H:].to(log_probs.device)
    return -log_probs.double().gather(-1, target.unsqueeze(-1))[:, scored_rows(H, positions), 0].mean(-1)


def demonstration_mass(pattern: Float[Tensor, "K H T"], n_examples: int) -> Float[Tensor, "K L+1"]:
    """Attention mass each copyer head puts on each example (L demonstrations, then the target),
    averaged over query positions.

    Args:
        pattern: one context's layer-1 (``blocks.0``) pattern ``[K, H, (L+1)*H]``: each head's attention from
            the target rows (``CausalTransformer.copyer_pattern``).
        n_examples: L, the number of demonstrations.

    Returns:
        ``[K, L+1]``: head k's mean mass on each example.
    """
    K, H, T = pattern.shape
    return pattern.double().view(K, H, n_examples + 1, T // (n_examples + 1)).sum(-1).mean(1)


def copy_mass(pattern: Float[Tensor, "K H T"], n_examples: int) -> Float[Tensor, "K L+1"]:
    """Attention mass on the SAME position h of each example: the exact-copy share of each head.

    Args:
        pattern: one context's layer-1 (``blocks.0``) pattern ``[K, H, (L+1)*H]``: each head's attention from
            the target rows (``CausalTransformer.copyer_pattern``).
        n_examples: L, the number of demonstrations.

    Returns:
        ``[K, L+1]``: head k's mean mass on position h of each example, from the query at h.
    """
    K, H, T = pattern.shape
    same = pattern.double().view(K, H, n_examples + 1, H).diagonal(dim1=1, dim2=3)  # [K, L+1, H]
    return same.mean(-1)


def head_assignment(pattern: Float[Tensor, "K H T"], n_examples: int) -> tuple[list[int], list[float]]:
    """For each copyer head, the demonstration it attends to most and the mass it puts there.

    Args:
        pattern: one context's layer-1 (``blocks.0``) pattern ``[K, H, (L+1)*H]``: each head's attention from
            the target rows (``CausalTransformer.copyer_pattern``).
        n_examples: L, the number of demonstrations.

    Returns:
        ``(demonstration, mass)``: two lists of K, the demonstration each head copies and its mass there.
    """
    if n_examples == 0:  # no demonstration to copy: every head reads the target's prefix
        return [-1] * pattern.shape[0], [0.0] * pattern.shape[0]
    mass = demonstration_mass(pattern, n_examples)[:, :n_examples]
    purity, demo = mass.max(-1)
    return demo.tolist(), purity.tolist()


# Weight-space measurements (Proposition 1, block structure) ------------------------------------
# Convention: a d x d block of W_KQ has rows = key token, columns = query token; the attention is
# invariant to adding a constant down each column, so blocks are compared through the softmax over
# rows of each column ("column softmax"). For W_OV (rows = token, softmax over each row) pass the
# transposes.


def fit_column_shift(
    block: Float[Tensor, "d d"], reference: Float[Tensor, "d d"]
) -> tuple[float, Float[Tensor, " d"], Float[Tensor, "d d"], float]:
    """Least squares ``block ~ c * reference + 1 a^T`` (a constant down each column).

    Returns ``(c, a, residual, correlation)``: the scale, the per-column shift, ``block - c ref - 1 a^T``
    and the Pearson correlation of the column-centred block with the column-centred reference.
    Closed form: centring each column removes ``a``; then ``c = <B_c, R_c> / <R_c, R_c>``.
    """
    b, r = block.double(), reference.double()
    if b.shape != r.shape or b.ndim != 2:
        raise ValueError(
            f"block and reference must be matrices of one shape, got {tuple(b.shape)} and {tuple(r.shape)}"
        )
    bc, rc = b - b.mean(0), r - r.mean(0)
    if rc.norm() == 0:
        raise ValueError("reference is constant down every column; the scale c is not identifiable")
    c = ((bc * rc).sum() / (rc * rc).sum()).item()
    a = (b - c * r).mean(0)
    corr = ((bc * rc).sum() / (bc.norm() * rc.norm())).item() if bc.norm() > 0 else 0.0
    return c, a, b - c * r - a, corr


def column_softmax_error(block: Float[Tensor, "d d"], reference: Float[Tensor, "d d"]) -> tuple[float, float]:
    """Max and mean over entries of ``|softmax_col(block) - softmax_col(reference)|``, where the softmax
    runs over the rows (key tokens) of each column (query token). Invariant to column shifts."""
    diff = (block.double().softmax(0) - reference.double().softmax(0)).abs()
    return diff.max().item(), diff.mean().item()


def block_norms(W: Float[Tensor, "D E"], d: int) -> Float[Tensor, "n m"]:
    """Frobenius norm of every d x d block of ``W`` (D and E multiples of d), float64."""
    D, E = W.shape
    if D % d or E % d:
        raise ValueError(f"W of shape {(D, E)} does not split into {d} x {d} blocks")
    return W.detach().double().reshape(D // d, d, E // d, d).norm(dim=(1, 3))


def off_diagonal_ratio(norms: Float[Tensor, "n n"]) -> float:
    """Mean off-diagonal over mean diagonal block norm of a square grid of block norms (nan if the
    diagonal is all zero, as at initialisation)."""
    n = norms.shape[0]
    if n < 2 or norms.shape != (n, n):
        raise ValueError(f"need a square grid of at least 2 x 2 block norms, got {tuple(norms.shape)}")
    diag = norms.diagonal().mean()
    off = (norms.sum() - norms.diagonal().sum()) / (n * n - n)
    return (off / diag).item() if diag > 0 else float("nan")


def parent_mass(attention: Float[Tensor, "batch H H"], parents: Int[Tensor, "batch H"]) -> float:
    """Mean attention (or posterior) mass on the true parent over contexts and positions h >= 1."""
    idx = parents[:, 1:].to(attention.device).unsqueeze(-1)
    return attention[:, 1:].double().gather(-1, idx).mean().item()
