"""The Bayesian-model-averaging oracle (Lemma 1): the optimum the two-layer model should reach.

``P(pa(h) = h' | demos) = softmax_{h' < h} sum_l log pi(x_h^l | x_h'^l)`` and the predictive
``P(x_h^{L+1} = s) = sum_{h' < h} P(pa(h) = h' | demos) pi(s | x_h'^{L+1})``, both computed in log
space so that zeros in pi give -inf scores and never NaN. Row 0 (the root) has no candidate parents:
its posterior row is all zeros and its predictive is the root distribution.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from probes.tasks import check_distribution, check_kernel


def check_tokens(tokens: Tensor, d_vocab: int, n_examples: int, seq_len: int) -> Int[Tensor, "batch T"]:
    """Validate a batch of flat contexts: integer ids in [0, d) and length (L+1)*H.

    Args:
        tokens: the contexts, ``[batch, (L+1)*H]`` (anything ``torch.as_tensor`` takes).
        d_vocab: d, the number of task tokens.
        n_examples: L, the number of demonstrations.
        seq_len: H, the tokens in a sequence.

    Returns:
        The tokens as int64.

    Raises:
        ValueError: a float, bool or complex dtype, a wrong shape, or an id outside [0, d), in one line.
    """
    tokens = torch.as_tensor(tokens)
    n_tokens = (n_examples + 1) * seq_len
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool or tokens.is_complex():
        raise ValueError(f"tokens must be integer ids, got dtype {tokens.dtype}")
    if tokens.ndim != 2 or tokens.shape[1] != n_tokens:
        raise ValueError(
            f"tokens must have shape [batch, (L+1)*H] = [batch, {n_tokens}] "
            f"(L={n_examples}, H={seq_len}), got {tuple(tokens.shape)}"
        )
    if tokens.numel() and (tokens.min() < 0 or tokens.max() >= d_vocab):
        raise ValueError(
            f"token ids must lie in [0, {d_vocab}), got values in [{tokens.min().item()}, {tokens.max().item()}]"
        )
    return tokens.long()


# bma_scores, bma_log_posterior and bma_posterior take the same arguments, each signature written out with its
# shapes (jaxtyping) rather than hidden behind *args: `duplicates` pairs them.
def bma_scores(
    pi: Float[Tensor, "d d"],
    tokens: Int[Tensor, "batch T"],
    n_examples: int,
    seq_len: int,
    demonstrations: Sequence[int] | None = None,
) -> Float[Tensor, "batch H H"]:
    """Lemma 1 logits ``sum_l log pi(x_h^l | x_h'^l)`` at [b, h, h'], -inf where h' >= h.

    Args:
        pi: the task's Markov kernel, ``pi[a, b] = pi(b | a)``, rows summing to 1 (zeros allowed).
        tokens: flat contexts, L demonstrations then the target, example-major (index ``l * H + h``).
        n_examples: L, the number of demonstrations.
        seq_len: H, the tokens in a sequence.
        demonstrations: the demonstration indices to condition on (default: all L).

    Returns:
        The scores ``[batch, H, H]``, query h first, candidate parent h' second.
    """
    log_pi = check_kernel(pi).log()
    tokens = check_tokens(tokens, log_pi.shape[0], n_examples, seq_len).to(log_pi.device)
    demos = tokens.view(-1, n_examples + 1, seq_len)[:, :n_examples]
    if demonstrations is not None:
        demos = demos[:, list(demonstrations)]
    d = log_pi.shape[0]
    # pair[b, l, h', h] = flat index of log pi[x_h'^l, x_h^l]; sum over l, then put the query first.
    pair = demos.unsqueeze(3) * d + demos.unsqueeze(2)
    scores = log_pi.flatten()[pair].sum(1).transpose(1, 2)
    H = seq_len
    causal = torch.ones(H, H, dtype=torch.bool, device=scores.device).tril(-1)
    return scores.masked_fill(~causal, float("-inf"))


def bma_log_posterior(
    pi: Float[Tensor, "d d"],
    tokens: Int[Tensor, "batch T"],
    n_examples: int,
    seq_len: int,
    demonstrations: Sequence[int] | None = None,
) -> Float[Tensor, "batch H H"]:
    """log P(pa(h) = h' | demos); -inf where h' >= h and on row 0, and on every candidate of a row
    in which all candidates have zero likelihood (data impossible under pi).

    Args:
        pi: the kernel ``[d, d]`` (as ``bma_scores``).
        tokens: the contexts ``[batch, (L+1)*H]``.
        n_examples: L.
        seq_len: H.
        demonstrations: the demonstrations conditioned on (default: all).

    Returns:
        The log-posterior ``[batch, H, H]``, query h first, candidate parent h' second.
    """
    scores = bma_scores(pi, tokens, n_examples, seq_len, demonstrations)
    norm = scores.logsumexp(-1, keepdim=True)
    # Rows with no finite candidate (row 0; impossible data) stay -inf instead of -inf - -inf = NaN.
    return torch.where(torch.isfinite(norm), scores - norm, torch.full_like(scores, float("-inf")))


def bma_posterior(
    pi: Float[Tensor, "d d"],
    tokens: Int[Tensor, "batch T"],
    n_examples: int,
    seq_len: int,
    demonstrations: Sequence[int] | None = None,
) -> Float[Tensor, "batch H H"]:
    """P(pa(h) = h' | demos) at [b, h, h'] (float64); row 0 is all zeros.

    Args:
        pi: the task's Markov kernel, ``pi[a, b] = pi(b | a)``, rows summing to 1 (zeros allowed).
        tokens: flat contexts, L demonstrations then the target, example-major (index ``l * H + h``).
        n_examples: L, the number of demonstrations.
        seq_len: H, the tokens in a sequence.
        demonstrations: the demonstration indices to condition on (default: all L), e.g.
            ``[l for l in range(L) if l != k]`` for BMA without demonstration k.

    Returns:
        The posterior ``[batch, H, H]`` (float64): row h sums to 1 over the candidates h' < h.
    """
    return bma_log_posterior(pi, tokens, n_examples, seq_len, demonstrations).exp()


def bma_predictive(
    pi: Float[Tensor, "d d"],
    tokens: Int[Tensor, "batch T"],
    n_examples: int,
    seq_len: int,
    root: Float[Tensor, " d"] | None = None,
    demonstrations: Sequence[int] | None = None,
    log: bool = False,
) -> Float[Tensor, "batch H d"]:
    """BMA predictive distribution of the target token at every position (float64).

    Args:
        pi: the task's Markov kernel, ``pi[a, b] = pi(b | a)``, rows summing to 1 (zeros allowed).
        tokens: flat contexts, L demonstrations then the target, example-major (index ``l * H + h``).
        n_examples: L, the number of demonstrations.
        seq_len: H, the tokens in a sequence.
        root: the distribution of the root token x_1, ``[d]`` (default: uniform).
        demonstrations: the demonstration indices to condition on (default: all L).
        log: return log-probabilities instead.

    Returns:
        ``[batch, H, d]`` (float64): row h is ``P(x_h = s | demonstrations, x_<h)`` of the target; row 0 the
        root distribution.
    """
    log_pi = check_kernel(pi).log()
    d = log_pi.shape[0]
    root = torch.full((d,), 1 / d, dtype=torch.float64) if root is None else check_distribution(root, d)
    log_post = bma_log_posterior(pi, tokens, n_examples, seq_len, demonstrations)  # [b, h, h']
    target = tokens.view(-1, n_examples + 1, seq_len)[:, n_examples].to(log_pi.device)  # [b, h']
    # log sum_h' P(h' | demos) pi(s | x_h'): [b, h, h', 1] + [b, 1, h', d], logsumexp over h'.
    log_pred = (log_post.unsqueeze(-1) + log_pi[target].unsqueeze(1)).logsumexp(2)
    log_pred[:, 0] = root.log().to(log_pred.device)
    return log_pred if log else log_pred.exp()
