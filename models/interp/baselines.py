"""What a model's heads are measured against, on the same contexts: BMA and the uniform-parent mixture
(``baselines``; for a task of the family, its own Bayes oracle and plateau: ``family_baselines``; per context:
``per_context_baselines``), and a layer's attention scored against BMA's posterior (``head_attention_stats``).
Used by ``analyses.inspect``, ``analyses.circuit`` and ``analyses.trajectory``."""

from __future__ import annotations

import torch

from probes import bma_posterior, bma_predictive, oracles, target_nll, total_variation
from probes.graph_task import GraphTask
from probes.metrics import parent_set_accuracy, per_context_nll
from probes.oracles import uniform_parent_predictive


def head_attention_stats(rows, parents, posterior, n_examples: int, seq_len: int) -> dict:
    """Candidate mass, TV to BMA and parent accuracy of the renormalised candidate attention, and
    copy mass on position h of each demonstration. ``rows`` is one layer's
    ``LayerAttention.target_rows``, ``[batch, head, H, (L+1) H]``."""
    L, H = n_examples, seq_len
    cand = rows[..., L * H :].clone()
    cand = cand.masked_fill(torch.ones(H, H, dtype=torch.bool).triu(), 0)  # keys h' < h only
    mass = cand.sum(-1)  # [batch, n, H]
    renorm = cand / mass.clamp_min(1e-30).unsqueeze(-1)
    n = rows.shape[1]
    same = rows.view(*rows.shape[:3], L + 1, H).diagonal(dim1=2, dim2=4)[:, :, :L]  # [batch, n, L, H]
    return {
        "candidate_mass": [mass[:, j, 1:].mean().item() for j in range(n)],
        "tv": [total_variation(renorm[:, j], posterior)[:, 1:].mean().item() for j in range(n)],
        "parent_acc": [parent_set_accuracy(renorm[:, j], parents) for j in range(n)],
        "copy_mass": same.mean((0, 3)).tolist(),  # [n, L]: mass on x_h^l from the query predicting x_h
    }


def per_context_baselines(task, tokens) -> tuple[torch.Tensor, torch.Tensor]:
    """Per context (``[batch]`` each), the uniform-parent plateau's NLL and Bayes' (BMA's; for a task of the
    family, its own oracle's): the two ends of the progress."""
    plateau = per_context_nll(uniform_parent_predictive(task, tokens), tokens)
    if isinstance(task, GraphTask):
        bayes = oracles.bayes(task, tokens)[0]
    else:
        bayes = bma_predictive(task.pi, tokens, task.n_examples, task.seq_len, task.root, log=True)
    return plateau, per_context_nll(bayes, tokens)


def baselines(task, tokens, parents) -> dict:
    """NLL, TV and parent accuracy of BMA and the uniform-parent mixture on the same contexts (a task of
    the family: ``family_baselines``), with BMA's posterior and the two predictions they score
    (``log_bayes``, ``log_plateau``: ``[batch, H, d]`` log-probabilities, as ``per_context_baselines`` reads them)."""
    if isinstance(task, GraphTask):
        return family_baselines(task, tokens, parents)
    L, H = task.n_examples, task.seq_len
    posterior = bma_posterior(task.pi, tokens, L, H)
    uniform = bma_posterior(task.pi, tokens, L, H, demonstrations=[])  # uniform over h' < h
    log_bayes = bma_predictive(task.pi, tokens, L, H, task.root, log=True)
    log_plateau = uniform_parent_predictive(task, tokens)
    return {
        "posterior": posterior,
        "log_bayes": log_bayes,
        "log_plateau": log_plateau,
        "nll_bma": target_nll(log_bayes, tokens),
        "nll_uniform": target_nll(log_plateau, tokens),
        "acc_bma": parent_set_accuracy(posterior, parents),
        "acc_uniform": parent_set_accuracy(uniform, parents),
        "tv_uniform": total_variation(uniform, posterior)[:, 1:].mean().item(),
    }


def family_baselines(task, tokens, parents) -> dict:
    """``baselines`` for a task of the family (``probes.graph_task``), against its own Bayes oracle
    (``probes.oracles.bayes``: the predictive and the posterior over each position's parents; a fixed graph's
    is the graph) and its plateau (``probes.oracles.uniform_parent_predictive``: the unigram strategy); the
    uniform baseline spreads each position's attention evenly over h' < h."""
    H = task.seq_len
    predictive, posterior = oracles.bayes(task, tokens)
    log_plateau = uniform_parent_predictive(task, tokens)
    uniform = torch.ones(H, H, dtype=torch.float64).tril(-1)
    uniform = (uniform / uniform.sum(-1, keepdim=True).clamp_min(1)).expand_as(posterior)
    return {
        "posterior": posterior,
        "log_bayes": predictive,
        "log_plateau": log_plateau,
        "nll_bma": target_nll(predictive, tokens),
        "nll_uniform": target_nll(log_plateau, tokens),
        "acc_bma": parent_set_accuracy(posterior, parents),
        "acc_uniform": parent_set_accuracy(uniform, parents),
        "tv_uniform": total_variation(uniform, posterior)[:, 1:].mean().item(),
    }
