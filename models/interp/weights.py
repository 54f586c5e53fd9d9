"""What the weights store (Proposition 1 and the block structure of ``docs/paper.md``): the diagonal copy blocks
of the disentangled model's W_KQ fitted to ``log pi`` and its W_OV token block to ``log pi`` by rows
(``logpi_recovery``), the values the layer-2 head really mixes (``effective_value_error``), the block norms of W_KQ
(``block_structure``) over training snapshots (``emergence``), and a CatFormer's blocks of A
(``catformer_blocks``). Plain functions of a model: ``analyses.logpi_recovery`` and ``analyses.block_structure``
draw and report them."""

from __future__ import annotations

from pathlib import Path

import torch

from models.interp.subject import head_label
from models.loading.loading import load
from models.plumbing.io import UsageError
from models.plumbing.progress import progress as progress_bar
from probes import head_assignment
from probes.metrics import block_norms, column_softmax_error, dag_parent_mass, fit_column_shift, off_diagonal_ratio


def fit_to_log_pi(block: torch.Tensor, log_pi: torch.Tensor) -> dict:
    """Fit ``block ~ c log_pi + 1 a^T`` and measure the column-softmax error at scale c and at 1."""
    c, shift, residual, corr = fit_column_shift(block, log_pi)
    err_fit = column_softmax_error(block.double() / c, log_pi) if c != 0 else (float("nan"),) * 2
    err_unit = column_softmax_error(block, log_pi)
    # Share of the residual's energy that is a constant down each ROW (a key-token bias, which the
    # column-shift invariance does not absorb).
    row_part = residual.mean(1, keepdim=True).expand_as(residual)
    row_share = (row_part.norm() ** 2 / residual.norm() ** 2).item() if residual.norm() > 0 else 0.0
    return {
        "c": c,
        "correlation": corr,
        "error_fitted_max": err_fit[0],
        "error_fitted_mean": err_fit[1],
        "error_unit_max": err_unit[0],
        "error_unit_mean": err_unit[1],
        "shift": shift,
        "residual_row_share": row_share,
        "block": block.double(),
        "residual": residual,
    }


@torch.no_grad()
def logpi_recovery(model, pi: torch.Tensor) -> dict:
    """Fit every diagonal copy block of W_KQ to log pi and the token block of W_OV to log pi.

    Returns ``blocks`` (one dict per head k: head, demonstration, purity, c, correlation, errors,
    block [d,d], residual [d,d]), ``ov`` (the same for W_OV[:d] in row convention: block and residual
    are [d,d] with rows = current token), ``log_pi`` [d,d], and the worst errors over heads.
    """
    log_pi = pi.double().log()
    d, K = model.cfg.d_vocab, model.cfg.n_copy_heads
    if tuple(log_pi.shape) != (d, d):
        raise UsageError(f"pi has shape {tuple(pi.shape)}, expected ({d}, {d}) to match the model's d_vocab")
    if not torch.isfinite(log_pi).all():
        raise UsageError("pi has zero entries, so log pi is not finite; expected a kernel with pi > 0")
    demos, purity = head_assignment(model.copyer_pattern().cpu(), model.cfg.n_examples)
    W = model.W_KQ.detach().cpu()
    blocks = []
    for k in range(K):
        s = slice((k + 1) * d, (k + 2) * d)
        blocks.append(
            {"head": head_label(0, k), "demonstration": demos[k], "purity": purity[k], **fit_to_log_pi(W[s, s], log_pi)}
        )
    # W_OV: softmax over each row, invariance = constant per row, i.e. the column convention on W^T.
    ov = fit_to_log_pi(model.W_OV.detach().cpu()[:d].T, log_pi.T)
    ov.update(
        block=ov["block"].T,
        residual=ov["residual"].T,
        copy_rows_norm=model.W_OV.detach()[d:].norm().item(),
        token_rows_norm=model.W_OV.detach()[:d].norm().item(),
    )
    worst = {key: max(b[key] for b in blocks) for key in ("error_fitted_max", "error_unit_max")}
    # In W_OV the roles swap: rows = current token, the residual's share constant down each COLUMN is
    # an offset on the next-token logits shared by all tokens (what the copy rows of W_OV add on average).
    ov["residual_column_share"] = ov.pop("residual_row_share")
    return {
        "log_pi": log_pi,
        "blocks": blocks,
        "ov": ov,
        "worst": worst,
        "c_range": [min(b["c"] for b in blocks), max(b["c"] for b in blocks)],
        "min_correlation": min(b["correlation"] for b in blocks),
    }


@torch.no_grad()
def effective_value_error(model, pi: torch.Tensor, tokens: torch.Tensor) -> dict:
    """The value distribution the head actually mixes, ``softmax(resid_h' @ W_OV)`` (copy rows
    included), averaged over key positions with target token a, against ``pi[a]``.

    Returns ``mean_value`` [d,d] (row a: average value given x_h' = a; NaN for tokens never seen) and
    ``error_max``, the max abs difference to pi over tokens that occur.
    """
    _, cache = model.run_with_cache(tokens, names_filter="blocks.1.attn.hook_v")
    value = cache["blocks.1.attn.hook_v"][:, :, 0].exp().double().cpu()  # [batch, H, d]
    x = tokens[:, -model.cfg.seq_len :]
    d = model.cfg.d_vocab
    mean = torch.full((d, d), float("nan"), dtype=torch.float64)
    for a in range(d):
        if (x == a).any():
            mean[a] = value[x == a].mean(0)
    seen = ~mean.isnan().any(1)
    return {"mean_value": mean, "error_max": (mean[seen] - pi.double()[seen]).abs().max().item()}


@torch.no_grad()
def block_structure(model) -> dict:
    """Block norms of W_KQ and the summary ratios.

    Returns ``norms`` [(K+1), (K+1)], ``ratio`` (mean off-diagonal / mean diagonal norm over the copy
    blocks 1..K), ``diag_mean``, ``off_mean``, ``off_max``, ``token_key_row`` [K] (norms of the blocks
    pairing the key's token subspace with each query copy), ``token_query_column`` [K+1] (the query's
    token subspace: masked, zero), and the head -> demonstration labels.
    """
    d, K = model.cfg.d_vocab, model.cfg.n_copy_heads
    norms = block_norms(model.W_KQ.cpu(), d)
    copy = norms[1:, 1:]
    off = copy[~torch.eye(K, dtype=torch.bool)] if K > 1 else copy.new_zeros(0)
    demos, _ = head_assignment(model.copyer_pattern().cpu(), model.cfg.n_examples)
    return {
        "norms": norms,
        "ratio": off_diagonal_ratio(copy) if K > 1 else float("nan"),
        "diag_mean": copy.diagonal().mean().item(),
        "off_mean": off.mean().item() if K > 1 else float("nan"),
        "off_max": off.max().item() if K > 1 else float("nan"),
        "token_key_row": norms[0, 1:],
        "token_key_row_mean_over_diag": (norms[0, 1:].mean() / copy.diagonal().mean()).item(),
        "token_query_column": norms[:, 0],
        "head_demo": demos,
        "labels": ["tok"] + [f"{head_label(0, k)}\n(d{demos[k]})" for k in range(K)],
    }


def emergence(snapshots: list[tuple[int, Path]], progress: bool = True) -> list[dict]:
    """``block_structure`` of every snapshot, in step order (plus ``step``)."""
    out = []
    for step, path in progress_bar(snapshots, "snapshots", enabled=progress):
        out.append({"step": step, **block_structure(load(path))})
    return out


@torch.no_grad()
def catformer_blocks(model, parents: list[list[int]] | None) -> dict:
    """Per head of a CatFormer (``models.nets.catformer``), the Frobenius norm of every block of its A over the
    named blocks of its residual (token, position, each earlier head's copy), rows the query's blocks and
    columns the key's (their ``x A x^T``). With a fixed graph, also Nichani et al.'s measure of layer 0: the
    softmax of the causally masked position-position block, its mass on each position's parent, averaged
    over the positions that have one (their ``many_graphs.ipynb``)."""
    heads = []
    for layer, block in enumerate(model.blocks):
        names = model.residual_blocks(layer)
        for h, A in enumerate(block.attn.A.detach().double().cpu()):
            norms = [[A[a0:a1, b0:b1].norm().item() for _, b0, b1 in names] for _, a0, a1 in names]
            heads.append({"head": head_label(layer, h), "blocks": [n for n, _, _ in names], "norms": norms})
    out = {"family": "CatFormer", "heads": heads, "parent_attention": None}
    if parents is not None:
        out["parent_attention"] = dag_parent_mass(model.positional_attention(0, 0), parents)
        if out["parent_attention"] is not None:
            out["parent_edges"] = sum(len(ps) == 1 for ps in parents[: model.cfg.n_ctx])
    return out
