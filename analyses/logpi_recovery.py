"""Proposition 1: do the diagonal blocks of W_KQ store log pi, and does W_OV store pi?

    python -m analyses.logpi_recovery                       # the shipped checkpoint
    python -m analyses.logpi_recovery --checkpoint theorem1:beta=50

Head k writes residual subspace k+1, so its diagonal block of W_KQ is
``W_kk = W_KQ[(k+1)d:(k+2)d, (k+1)d:(k+2)d]`` (rows: key token, columns: query token). It scores the
pair (x_h'^l, x_h^l) of the demonstration l that head k copies (the measured head assignment, never
assumed to be l = k). The attention is unchanged by a constant down each column, so each block is fitted
as ``W_kk ~ c log pi + 1 a^T`` by least squares and compared through the column softmax (softmax over
the key tokens of each query-token column):

    column-softmax error = max over entries |softmax_col(W_kk / c) - softmax_col(log pi)|

(the mean over entries is reported too), at the fitted scale c and at scale 1. Soft copies make a
trained block a scaled copy (c != 1), so both are reported. The value side reads
``softmax(W_OV[:d])`` over each ROW (token a -> distribution of the next token), so the token block of
W_OV is fitted as ``W_OV ~ c log pi + b 1^T`` (a constant per row) and compared by the row softmax.
"""

from __future__ import annotations

from analyses import common

NAME = "logpi_recovery"
REQUIRES = frozenset({common.DISENTANGLED, common.MARKOV_TASK})  # what it needs of its subject


class Config(common.Config):
    """What ``run`` computes: every field is also a flag."""

    n_contexts: int = common.n_contexts(2048, "contexts on which the values W_OV mixes are measured")


common.parse_first(globals())  # python -m: --help and a mistyped flag answer here, before torch is imported

import numpy as np

from models.interp.weights import effective_value_error, logpi_recovery  # the maths; here, its report

FIGURES = {
    "logpi_recovery.png": (
        "Proposition 1 in four panels: log pi (column-centred) beside the worst-fitting diagonal W_KQ block (column-centred, divided by its fitted scale c, values printed); every entry of all diagonal blocks against log pi's (one colour per head and the demonstration it copies, y = x); the W_OV token block against log pi (row-centred), with the fitted c, correlation and softmax errors in the titles."
    ),
    "logpi_recovery_errors.png": (
        "column-softmax error of each diagonal block at scale 1 and at the fitted c, against the paper's 0.05 (W_OV: row softmax against pi)."
    ),
}
CLAIM_FITTED_ERROR = 0.05  # the paper's column-softmax error bound for trained models


def _heatmap(ax, m, vmax, title: str, xlabel: str, ylabel: str):
    """One annotated d x d heatmap (diverging, symmetric about 0)."""
    im = ax.imshow(m, cmap="RdBu_r", vmin=-vmax, vmax=vmax)
    ax.grid(False)
    d = m.shape[0]
    for i in range(d):
        for j in range(d):
            ax.text(j, i, f"{m[i, j]:.2f}", ha="center", va="center", fontsize=9,
                    color="w" if abs(m[i, j]) > 0.6 * vmax else "k")  # fmt: skip
    ax.set_xticks(range(d))
    ax.set_yticks(range(d))
    ax.set(xlabel=xlabel, ylabel=ylabel)
    ax.set_title(title, fontsize=11)
    return im


def _plot(res: dict, name: str):
    """Proposition 1 at a glance: log pi, the worst diagonal W_KQ block beside it, every block's entries
    against log pi's, and the W_OV token block against log pi (row convention)."""
    import matplotlib.pyplot as plt

    blocks = sorted(res["blocks"], key=lambda b: (b["demonstration"], b["head"]))
    log_pi, ov = res["log_pi"], res["ov"]
    col = (log_pi - log_pi.mean(0)).numpy()  # the W_KQ convention: a constant per column is free
    row = (log_pi - log_pi.mean(1, keepdim=True)).numpy()  # the W_OV convention: a constant per row
    centred = [((b["block"] - b["block"].mean(0)) / b["c"]).numpy() for b in blocks]
    ov_centred = ((ov["block"] - ov["block"].mean(1, keepdim=True)) / ov["c"]).numpy()
    worst = max(range(len(blocks)), key=lambda i: blocks[i]["error_fitted_max"])
    wb = blocks[worst]
    vmax = max(abs(col).max(), abs(centred[worst]).max())
    fig, axes = plt.subplots(2, 2, figsize=(10.5, 9.5), layout="constrained")
    _heatmap(axes[0, 0], col, vmax, "log π, column-centred", "query token x_h", "key token x_h'")
    im = _heatmap(
        axes[0, 1], centred[worst], vmax,
        f"worst W_KQ block: {wb['head']} (copies demo {wb['demonstration']})\n"
        f"column-centred ÷ c = {wb['c']:.2f}; col-softmax error {wb['error_fitted_max']:.3f}",
        "query token x_h", "key token x_h'",
    )  # fmt: skip
    fig.colorbar(im, ax=axes[0, :].tolist(), shrink=0.8, label="centred value")
    ax = axes[1, 0]
    lo, hi = col.min() - 0.2, col.max() + 0.2
    for i, (b, m) in enumerate(zip(blocks, centred)):
        ax.scatter(col.ravel(), m.ravel(), s=14, alpha=0.7, color=plt.cm.tab10(i % 10),
                   label=f"{b['head']} (demo {b['demonstration']})")  # fmt: skip
    ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="y = x")
    ax.set(
        xlim=(lo, hi), ylim=(lo, hi), xlabel="log π (column-centred)", ylabel="W_KQ block entry (column-centred ÷ c)"
    )
    ax.set_title(
        f"all {len(blocks)} diagonal W_KQ blocks ≈ c log π\nc in [{res['c_range'][0]:.2f}, {res['c_range'][1]:.2f}], "
        f"corr ≥ {res['min_correlation']:.3f}\ncolumn-softmax error ≤ {res['worst']['error_fitted_max']:.3f} "
        f"(claim ≤ {CLAIM_FITTED_ERROR}; at c = 1: {res['worst']['error_unit_max']:.2f})",
        fontsize=11,
    )
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    ax = axes[1, 1]
    lo, hi = min(row.min(), ov_centred.min()) - 0.2, max(row.max(), ov_centred.max()) + 0.2
    ax.scatter(row.ravel(), ov_centred.ravel(), s=22, color="C1")
    ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="y = x")
    ax.set(xlim=(lo, hi), ylim=(lo, hi), xlabel="log π (row-centred)", ylabel="W_OV[:d] entry (row-centred ÷ c)")
    ax.set_title(
        f"the W_OV token block ≈ c log π (c = {ov['c']:.2f})\ncorr {ov['correlation']:.3f}, row-softmax error "
        f"{ov['error_fitted_max']:.3f}\nthe values it mixes (copy rows included): {ov['effective_value']['error_max']:.4f} from π",
        fontsize=11,
    )
    ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(f"{name}: Proposition 1, the copy blocks of W_KQ and the token block of W_OV store log π", fontsize=12)
    return fig


def _plot_errors(res: dict, name: str):
    import matplotlib.pyplot as plt

    blocks = sorted(res["blocks"], key=lambda b: (b["demonstration"], b["head"]))
    labels = [f"{b['head']}\ndemo {b['demonstration']}" for b in blocks] + ["W_OV"]
    fitted = [b["error_fitted_max"] for b in blocks] + [res["ov"]["error_fitted_max"]]
    unit = [b["error_unit_max"] for b in blocks] + [res["ov"]["error_unit_max"]]
    x = np.arange(len(labels))
    fig, ax = plt.subplots(figsize=(max(5, 0.6 * len(labels) + 1.5), 3.2))
    ax.bar(x - 0.2, unit, 0.4, label="scale 1", color="0.7")
    ax.bar(x + 0.2, fitted, 0.4, label="fitted scale c", color="C0")
    ax.axhline(CLAIM_FITTED_ERROR, color="C3", ls="--", lw=1, label=f"paper bound {CLAIM_FITTED_ERROR}")
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("max |softmax_col − softmax_col(log π)|")
    ax.set_title(f"{name}: column-softmax error per diagonal block (W_OV: row softmax vs π)", fontsize=9)
    ax.legend(fontsize=7)
    return fig


def compute(subject, config: Config) -> dict:
    res = logpi_recovery(subject.model, subject.task.pi)
    tokens, _ = common.sample_contexts(subject.task, config.n_contexts, config.seed)
    res["ov"]["effective_value"] = effective_value_error(subject.model, subject.task.pi, tokens)
    return res


def figures(result: common.Result) -> dict:
    res = result.data
    return {NAME: _plot(res, result.title), f"{NAME}_errors": _plot_errors(res, result.title)}


def summary(res: dict) -> str:
    lines = [f"{NAME}: {len(res['blocks'])} diagonal W_KQ blocks fitted as c log pi + 1 a^T"]
    for b in sorted(res["blocks"], key=lambda b: b["demonstration"]):
        lines.append(
            f"  {b['head']} (demo {b['demonstration']}, purity {b['purity']:.3f}): c={b['c']:.4f}  "
            f"corr={b['correlation']:.4f}  col-softmax err fitted {b['error_fitted_max']:.2e} "
            f"(mean {b['error_fitted_mean']:.2e})  scale-1 {b['error_unit_max']:.2e}"
        )
    ov = res["ov"]
    lines += [
        f"  W_OV token block (row softmax vs pi): c={ov['c']:.4f}  corr={ov['correlation']:.4f}  "
        f"err fitted {ov['error_fitted_max']:.2e}  scale-1 {ov['error_unit_max']:.2e}  "
        f"(copy-subspace rows norm {ov['copy_rows_norm']:.3f} vs token rows {ov['token_rows_norm']:.3f}; "
        f"{ov['residual_column_share']:.0%} of the residual is one logit offset shared by all tokens)",
        f"  effective value softmax(resid @ W_OV) given x_h' = a, copy rows included, on the sampled contexts: "
        f"max |mean - pi[a]| = {ov['effective_value']['error_max']:.2e}",
        f"  W_KQ residuals: {min(b['residual_row_share'] for b in res['blocks']):.0%}-"
        f"{max(b['residual_row_share'] for b in res['blocks']):.0%} of their energy is a per-key-token (row) constant",
        f"  worst W_KQ block error at fitted c: {res['worst']['error_fitted_max']:.3g} "
        f"(claim <= {CLAIM_FITTED_ERROR}); at scale 1: {res['worst']['error_unit_max']:.3g}; "
        f"c in [{res['c_range'][0]:.3f}, {res['c_range'][1]:.3f}]",
    ]
    return "\n".join(lines)


WHY_NOT = {  # why log pi cannot be read from these families' weights (added to their one-line refusal)
    "CatFormer": "its A holds no log pi: in Nichani et al.'s construction layer 1's A matches the test token "
    "against each key's copy of its parent's token, an identity block, and the transition enters as counts "
    "through the values; with a fixed kernel the Bayes prediction pi(. | x_T) needs no attention and can sit in "
    "the read-out W",
}
ANALYSIS = common.register(globals())
