"""The Bayes predictive of every task in the family, the simpler strategies, and a model's distance from each.

At target position h the predictor has seen the L demonstrations whole and the target's prefix x_{<h}.

- ``markov_tree`` (ours, a fresh tree, kernel pi known): Lemma 1, ``probes.bma``.
- a fixed graph, fixed kernel: nothing to learn, ``tables[k][row of the parent values]``.
- a fixed graph, Dirichlet(alpha) kernel per context: the Dirichlet-posterior count estimate
  ``(c[r, s] + alpha) / (sum_s c[r, s] + d alpha)``, where c counts the (parent values, child) pairs of the
  same parent count seen so far (every demonstration position, target positions h' < h) and r is the
  row of the target's parent values; parentless positions draw from the known root distribution.
  An n-gram is the graph whose parents are the n-1 previous positions.
- a random tree per context with a Dirichlet kernel: the mixture over all (H-1)! trees of the count
  estimate, each weighted by its Dirichlet-multinomial marginal likelihood of what has been seen
  (exact; refused above ``MAX_TREES`` trees).

Strategies (``strategies``): ``uniform``; ``unigram`` and ``bigram`` (add-one counts of tokens, and of
(previous token, token) pairs within sequences, over everything seen so far; at h = 0 the bigram counts
first tokens); ``k-gram`` for k = 3..n on an n-gram task; ``stationary`` (the stationary distribution of a
fixed single-parent kernel); ``bayes``. All are log-probabilities ``[batch, H, d]`` at the target positions,
the convention of ``CausalTransformer`` (row 0 the root); ``distances`` compares a model's with each.
"""

from __future__ import annotations

import itertools
import math

import torch
from jaxtyping import Float, Int
from torch import Tensor

from probes.bma import bma_posterior, bma_predictive, check_tokens
from probes.graph_task import GraphTask, context_order, parent_rows, stationary_batch
from probes.tasks import MarkovTreeTask

MAX_TREES = 720  # (H-1)! trees: H <= 7 for a random tree with a Dirichlet kernel
DISTANCES = ("kl", "nll_gap")
CHUNK_ENTRIES = 2**24  # contexts are counted in chunks of at most this many match entries (128 MiB)


def graph_tensor(parents: list[list[int]], batch: int) -> Int[Tensor, "batch H P"]:
    """A parents list as ``[batch, H, P]`` padded with -1 (P >= 1)."""
    P = max([len(p) for p in parents] + [1])
    out = torch.full((len(parents), P), -1, dtype=torch.long)
    for h, ps in enumerate(parents):
        out[h, : len(ps)] = torch.tensor(ps, dtype=torch.long)
    return out.expand(batch, -1, -1)


def context_keys(x: Int[Tensor, "batch L1 H"], parents: Int[Tensor, "batch H P"], d: int) -> Int[Tensor, "batch L1 H"]:
    """The table row each token was drawn from, numbered across parent counts: ``offset(k) + row`` with
    k the position's parent count (k = 0: the single root row 0)."""
    b, L1, H = x.shape
    counts = (parents >= 0).sum(-1)  # [batch, H]
    offsets = torch.tensor([sum(d**j for j in range(k)) for k in range(parents.shape[-1] + 1)])
    keys = torch.empty_like(x)
    for h in range(H):
        ps = parents[:, h].clamp_min(0)  # padding reads position 0; masked below by the count
        k = counts[:, h]
        rows = torch.zeros(b, L1, dtype=torch.long)
        for kk in k.unique().tolist():
            sel = k == kk
            if kk:
                rows[sel] = parent_rows(x[sel], ps[sel, :kk], d)
        keys[:, :, h] = offsets[k].unsqueeze(1) + rows
    return keys


def count_log_predictive(
    tokens: Int[Tensor, "batch T"],
    n_examples: int,
    seq_len: int,
    d_vocab: int,
    parents: Int[Tensor, "batch H P"],
    alpha: float,
    root: Float[Tensor, " d"] | None = None,
) -> Float[Tensor, "batch H d"]:
    """log of ``(c + alpha) / (sum c + d alpha)`` at every target position: c counts the tokens seen so far
    (all demonstration positions, target positions h' < h) drawn from the same table row as x_h. With
    ``root`` given, parentless positions predict ``root`` instead of learning it."""
    L1, H, d = n_examples + 1, seq_len, d_vocab
    x = check_tokens(tokens, d, n_examples, seq_len).view(-1, L1, H)
    chunk = max(1, CHUNK_ENTRIES // (L1 * H * max(H, d)))  # the match and one-hot tensors of a chunk
    if len(x) > chunk:
        return torch.cat([
            count_log_predictive(tokens[i : i + chunk], n_examples, seq_len, d, parents[i : i + chunk], alpha, root)
            for i in range(0, len(x), chunk)
        ])  # fmt: skip
    keys = context_keys(x, parents, d)
    seen = torch.ones(L1, H, H, dtype=torch.bool)  # [l, h', h]: token (l, h') is seen when predicting h
    seen[L1 - 1] = torch.ones(H, H, dtype=torch.bool).tril(-1).T
    same = keys.view(-1, L1 * H, 1) == keys[:, -1].unsqueeze(1)  # [batch, (l, h'), h]
    match = (same & seen.view(1, L1 * H, H)).double()
    counts = torch.einsum("bth,bts->bhs", match, torch.nn.functional.one_hot(x.view(-1, L1 * H), d).double())
    log_pred = (counts + alpha).log() - (counts.sum(-1, keepdim=True) + d * alpha).log()
    if root is not None:
        parentless = (parents[:, :, 0] < 0).unsqueeze(-1)
        log_pred = torch.where(parentless, root.log().to(log_pred), log_pred)
    return log_pred


def _dirichlet_log_marginal(counts: Float[Tensor, "... rows d"], alpha: float) -> Float[Tensor, "..."]:
    """log of the Dirichlet-multinomial probability of a sequence with these counts (per row, summed)."""
    d = counts.shape[-1]
    per_row = math.lgamma(d * alpha) - torch.lgamma(counts.sum(-1) + d * alpha)
    per_row = per_row + (torch.lgamma(counts + alpha) - math.lgamma(alpha)).sum(-1)
    return per_row.sum(-1)


def check_bayes(task) -> None:
    """One ValueError if ``bayes`` cannot compute this task's predictive exactly (trainers call it first)."""
    if getattr(task, "stationary_root", False):
        raise ValueError(
            "roots drawn from each context's own stationary distribution (root=stationary with kernel=dirichlet) have "
            "no exact Bayes predictive here: the root's likelihood is not conjugate to the Dirichlet rows; use "
            "root=uniform, or kernel=fixed (whose stationary root is exact)"
        )
    if isinstance(task, GraphTask) and task.graph == "random_tree":
        n_trees = math.factorial(task.seq_len - 1)
        if n_trees > MAX_TREES:
            raise ValueError(
                f"seq_len {task.seq_len}: the exact Bayes predictive of a random tree with a per-context Dirichlet "
                f"kernel sums over the (H-1)! = {n_trees} trees; refused above {MAX_TREES} trees (seq_len <= 7)"
            )


def random_tree_dirichlet_bayes(task: GraphTask, tokens: Int[Tensor, "batch T"]) -> tuple[Tensor, Tensor]:
    """(log predictive ``[batch, H, d]``, parent posterior ``[batch, H, H]``) of a random tree per context
    with a Dirichlet(alpha) kernel, by summing over every tree (module docstring)."""
    L, H, d, alpha = task.n_examples, task.seq_len, task.d_vocab, task.alpha
    check_bayes(task)
    x = check_tokens(tokens, d, L, H).view(-1, L + 1, H)
    b = x.shape[0]
    target = x[:, L]
    log_w, log_pred, tree_parents = [], [], []
    for choice in itertools.product(*[range(h) for h in range(1, H)]):
        tree = torch.tensor([-1, *choice], dtype=torch.long)
        graph = tree.view(1, H, 1).expand(b, H, 1)
        lp = count_log_predictive(tokens, L, H, d, graph, alpha, task.root)  # [b, H, d]
        demos = x[:, :L]
        pairs = demos[:, :, tree[1:]] * d + demos[:, :, 1:]  # [b, L, H-1]: row a = x_parent, child s
        table = torch.zeros(b, d * d, dtype=torch.float64).scatter_add_(
            1, pairs.reshape(b, -1), torch.ones(b, L * (H - 1), dtype=torch.float64)
        )
        seen_target = lp.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # log pred of x_h, [b, H]
        seen_target[:, 0] = 0  # the root's term is the same under every tree
        prefix = seen_target.cumsum(1) - seen_target  # sum over 1 <= h' < h
        log_w.append(_dirichlet_log_marginal(table.view(b, d, d), alpha).unsqueeze(1) + prefix)
        log_pred.append(lp)
        tree_parents.append(tree)
    log_w = torch.stack(log_w)  # [trees, b, H]
    weights = (log_w - log_w.logsumexp(0)).exp()
    pred = (weights.log().unsqueeze(-1) + torch.stack(log_pred)).logsumexp(0)
    one_hot = torch.nn.functional.one_hot(torch.stack(tree_parents).clamp_min(0), H).double()  # [trees, H, H]
    one_hot[:, 0] = 0
    posterior = torch.einsum("tbh,thg->bhg", weights, one_hot)
    return pred, posterior


def _graph_posterior(parents: Int[Tensor, "batch H P"], H: int) -> Float[Tensor, "batch H H"]:
    """The known graph as a posterior: mass 1/k on each of position h's k parents (rows without one: 0)."""
    hot = torch.nn.functional.one_hot(parents.clamp_min(0), H).double() * (parents >= 0).unsqueeze(-1)
    total = hot.sum((-1, -2), keepdim=False).clamp_min(1).unsqueeze(-1)
    return hot.sum(-2) / total


def bayes(task, tokens: Int[Tensor, "batch T"]) -> tuple[Float[Tensor, "batch H d"], Float[Tensor, "batch H H"]]:
    """The exact Bayes predictive (log, float64) at the target positions and the posterior over each
    position's parents ``[b, h, h']`` (a fixed graph: 1/k on its k parents), for any task of the family.

    Args:
        task (MarkovTreeTask | GraphTask): Lemma 1's BMA for ours, the exact Bayes predictive for the family.
        tokens: the contexts ``[batch, (L+1)*H]``.

    Returns:
        ``(log_predictive, posterior)``: ``[batch, H, d]`` and ``[batch, H, H]``, float64.

    Raises:
        ValueError: a task with no exact oracle (a random tree with Dirichlet kernels above H = 7, a
            continuous task), in one line.
    """
    L, H, d = task.n_examples, task.seq_len, task.d_vocab
    tokens = check_tokens(tokens, d, L, H)
    check_bayes(task)
    if isinstance(task, MarkovTreeTask):
        return bma_predictive(task.pi, tokens, L, H, task.root, log=True), bma_posterior(task.pi, tokens, L, H)
    if not isinstance(task, GraphTask):
        raise ValueError(f"no Bayes oracle for a {type(task).__name__}; expected a discrete task of the family")
    if task.graph == "random_tree":
        return random_tree_dirichlet_bayes(task, tokens)
    parents = graph_tensor(task.parents, len(tokens))
    posterior = _graph_posterior(parents, H)
    if task.kernel == "dirichlet":
        return count_log_predictive(tokens, L, H, d, parents, task.alpha, task.root), posterior
    x = tokens.view(-1, L + 1, H)
    out = task.root.log().expand(len(tokens), H, d).clone()
    for h, ps in enumerate(task.parents):
        if ps:
            row = parent_rows(x[:, L : L + 1], parents[:, h, : len(ps)], d)[:, 0]
            out[:, h] = task.tables[len(ps)][row].log()
    return out, posterior


def uniform_parent_predictive(task: MarkovTreeTask | GraphTask, tokens, log: bool = True) -> Float[Tensor, "batch H d"]:
    """The plateau: attention spread evenly over the candidate parents, mean over h' < h of pi(. | x_h').
    It is BMA conditioned on no demonstration at all. On a family task (``GraphTask``), the plateau is the
    unigram strategy (add-one token counts, ``strategies``): the first phase of in-context Markov chains."""
    if isinstance(task, GraphTask):
        b, H = len(tokens), task.seq_len
        lp = count_log_predictive(tokens, task.n_examples, H, task.d_vocab, graph_tensor([[]] * H, b), 1.0)
        return lp if log else lp.exp()
    return bma_predictive(task.pi, tokens, task.n_examples, task.seq_len, task.root, demonstrations=[], log=log)


def stationary(pi: Float[Tensor, "d d"]) -> Float[Tensor, " d"]:
    """The stationary distribution of a row-stochastic kernel (the left eigenvector for eigenvalue 1)."""
    return stationary_batch(pi)


def strategies(task, tokens: Int[Tensor, "batch T"]) -> dict[str, Float[Tensor, "batch H d"]]:
    """Every strategy's log-probabilities (float64) at the target positions (module docstring).

    Args:
        task (MarkovTreeTask | GraphTask): a task of the family.
        tokens: the contexts ``[batch, (L+1)*H]``.

    Returns:
        By name (``uniform``, ``unigram``, ``bigram``, ``3-gram``, ...): log-probabilities ``[batch, H, d]``.
    """
    L, H, d = task.n_examples, task.seq_len, task.d_vocab
    tokens = check_tokens(tokens, d, L, H)
    b = len(tokens)
    none = [[] for _ in range(H)]
    out = {
        "uniform": torch.full((b, H, d), -math.log(d), dtype=torch.float64),
        "unigram": count_log_predictive(tokens, L, H, d, graph_tensor(none, b), 1.0),
    }
    for n in range(2, context_order(task) + 2):
        ngram = [list(range(max(0, h - n + 1), h)) for h in range(H)]
        out["bigram" if n == 2 else f"{n}-gram"] = count_log_predictive(tokens, L, H, d, graph_tensor(ngram, b), 1.0)
    single_fixed = isinstance(task, MarkovTreeTask) or (task.kernel == "fixed" and task.parent_counts == [1])
    if single_fixed:
        out["stationary"] = stationary(task.pi).log().expand(b, H, d).clone()
    out["bayes"] = bayes(task, tokens)[0]
    return out


def distances(
    log_probs: Float[Tensor, "batch H d"],
    references: dict[str, Float[Tensor, "batch H d"]],
    tokens: Int[Tensor, "batch T"],
    kind: str = "kl",
) -> dict[str, Float[Tensor, " H"]]:
    """Per target position, the mean over contexts of ``kl``: KL(reference || model), or ``nll_gap``: the
    model's NLL of x_h minus the reference's. Position 0 (the root) included; averages elsewhere skip it.

    Args:
        log_probs: the model's log-probabilities ``[batch, H, d]``.
        references: log-probabilities by name, each ``[batch, H, d]`` (``bayes``, ``strategies``).
        tokens: the contexts ``[batch, (L+1)*H]`` they were computed on.
        kind: ``kl`` or ``nll_gap``.

    Returns:
        By reference name: ``[H]``, the mean over contexts at each target position.
    """
    if kind not in DISTANCES:
        raise ValueError(f"distance kind must be one of {', '.join(DISTANCES)}, got {kind!r}")
    model = log_probs.double().cpu()
    H = model.shape[1]
    target = tokens[:, -H:].unsqueeze(-1).cpu()
    out = {}
    for name, ref in references.items():
        ref = ref.double().cpu()
        if ref.shape != model.shape:
            raise ValueError(
                f"strategy {name!r} has shape {tuple(ref.shape)}, the model's log-probs {tuple(model.shape)}"
            )
        if kind == "kl":
            p = ref.exp()
            per = torch.where(p > 0, p * (ref - model), torch.zeros_like(p)).sum(-1)
        else:
            per = (ref.gather(-1, target) - model.gather(-1, target)).squeeze(-1)
        out[name] = per.mean(0)
    return out
