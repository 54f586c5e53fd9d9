"""Is the trained W_KQ block-diagonal on the copy subspaces, and when does that structure emerge?

    python -m analyses.block_structure                               # shipped checkpoint + a short run
    python -m analyses.block_structure --snapshots runs/x            # snapshots of `models.train --snapshot-every N`
    python -m analyses.block_structure --checkpoint theorem1:beta=50 --train-steps 0

W_KQ is a (K+1) x (K+1) grid of d x d blocks: row i = key subspace, column j = query subspace,
subspace 0 = the target token, subspace k+1 = the copy written by copyer head k. The Theorem 1
construction is ``blockdiag(0, log pi, ..., log pi)``. Reported: the Frobenius norm of every block; the
ratio of the mean off-diagonal to the mean diagonal block norm on the copy subspaces (blocks 1..K);
and the token-subspace blocks apart: the key-token row (key x_h' against query copies) and the
query-token column (always exactly zero: the query's token subspace is masked, so it gets no gradient).

Emergence: with ``--snapshots DIR`` the snapshot checkpoints of a training run are measured in step
order; without it a short run of the subject's own training config (``--train-steps``, default 500,
about 5 s unloaded) is trained into a temporary folder (skip with ``--train-steps 0``).
"""

from __future__ import annotations

from analyses import common

NAME = "block_structure"
REQUIRES = frozenset({common.BILINEAR})  # what it needs of its subject (the disentangled model or a CatFormer)


class Config(common.Config):
    """What ``run`` computes: every field is also a flag."""

    snapshots: str | None = common.option(None, "run folder (or its snapshots/) of models.train --snapshot-every N")
    train_steps: int = common.option(500, "without --snapshots: steps of the short run to train (0: no emergence "
                                     "plot)", minimum=0, maximum=10**7)  # fmt: skip
    snapshot_every: int = common.option(50, "snapshot interval of that run", minimum=1, maximum=10**7)

common.parse_first(globals())  # python -m: --help and a mistyped flag answer here, before torch is imported

import tempfile
from pathlib import Path

import numpy as np

from models.interp.weights import block_structure, catformer_blocks, emergence  # the maths; here, its report
from models.training.short_run import find_snapshots, train_short_run

FIGURES = {
    "block_structure.png": (
        "|W_KQ| as a (K+1) x (K+1) grid of d x d blocks and the norm of each block; the off-diagonal / diagonal ratio on the copy subspaces is in the title."
    ),
    "block_structure_emergence.png": (
        "how the block-diagonal W_KQ emerges over a short training run: diagonal, off-diagonal and key-token block norms, the ratio against the 0.1 claim, block-norm grids at four steps."
    ),
}
CLAIM_RATIO = 0.1  # off-diagonal / diagonal block norm on the copy subspaces of a trained model


def _grid_axes(ax, K: int, d: int, labels: list[str]):
    for i in range(1, K + 1):
        ax.axhline(i * d - 0.5, color="k", lw=0.4)
        ax.axvline(i * d - 0.5, color="k", lw=0.4)
    ax.grid(False)
    ticks = [d * i + (d - 1) / 2 for i in range(K + 1)]
    ax.set_xticks(ticks, [lab.replace("\n", " ") for lab in labels], rotation=90, fontsize=8)
    ax.set_yticks(ticks, [lab.replace("\n", " ") for lab in labels], fontsize=8)


def _plot_structure(res: dict, name: str):
    import matplotlib.pyplot as plt

    K = res["norms"].shape[0] - 1
    d = res["w_kq_abs"].shape[0] // (K + 1)
    # constrained: no empty band under the title; the norms' grid large enough for 8 pt cell labels
    cell = 0.55  # inches per block of the norms' grid
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(2 * cell * (K + 1) + 3.5, cell * (K + 1) + 1.6), layout="constrained")
    im = a0.imshow(res["w_kq_abs"].numpy(), cmap="viridis")
    _grid_axes(a0, K, d, res["labels"])
    a0.set_xlabel("query subspace")
    a0.set_ylabel("key subspace")
    a0.set_title("|W_KQ|", fontsize=11)
    fig.colorbar(im, ax=a0, shrink=0.8)
    norms = res["norms"].numpy()
    im = a1.imshow(norms, cmap="viridis")
    for (i, j), v in np.ndenumerate(norms):
        a1.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=8, color="k" if v > norms.max() / 2 else "w")
    a1.set_xticks(range(K + 1), res["labels"], rotation=90, fontsize=8)
    a1.set_yticks(range(K + 1), res["labels"], fontsize=8)
    a1.set_title("Frobenius norm of each d×d block", fontsize=11)
    a1.grid(False)
    fig.colorbar(im, ax=a1, shrink=0.8)
    fig.suptitle(
        f"{name}: W_KQ blocks; copy subspaces off/diag norm ratio {res['ratio']:.3g}, "
        f"key-token row / diag {res['token_key_row_mean_over_diag']:.3g}",
        fontsize=12,
    )
    return fig


def _plot_emergence(series: list[dict], source: str):
    import matplotlib.pyplot as plt

    steps = [s["step"] for s in series]
    fig = plt.figure(figsize=(12, 4.2))
    gs = fig.add_gridspec(2, 6)
    a0 = fig.add_subplot(gs[:, :2])
    a0.plot(steps, [s["diag_mean"] for s in series], "o-", ms=3, label="diagonal copy blocks (mean)")
    a0.plot(steps, [s["off_mean"] for s in series], "o-", ms=3, label="off-diagonal copy blocks (mean)")
    a0.plot(steps, [s["token_key_row"].mean().item() for s in series], "o-", ms=3, label="key-token row (mean)")
    a0.set_xlabel("training step")
    a0.set_ylabel("block Frobenius norm")
    a0.legend(fontsize=7)
    a1 = fig.add_subplot(gs[:, 2:4])
    a1.semilogy(steps, [s["ratio"] for s in series], "o-", ms=3, color="C3")
    a1.axhline(CLAIM_RATIO, color="k", ls="--", lw=1, label=f"claim {CLAIM_RATIO}")
    a1.set_xlabel("training step")
    a1.set_ylabel("off-diagonal / diagonal norm")
    a1.legend(fontsize=7)
    picks = sorted({0, len(series) // 3, 2 * len(series) // 3, len(series) - 1})
    for n, i in enumerate(picks[:4]):
        ax = fig.add_subplot(gs[n // 2, 4 + n % 2])
        ax.imshow(series[i]["norms"].numpy(), cmap="viridis")
        ax.set_title(f"step {series[i]['step']}", fontsize=7)
        ax.grid(False)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(f"Emergence of the block-diagonal W_KQ over training ({source}); right: block-norm grids", fontsize=10)
    fig.tight_layout()
    return fig




def compute(subject, config: Config) -> dict:
    """The block structure of the subject (with ``w_kq_abs``, |W_KQ|, for the figure) and, from
    ``--snapshots`` or a short training run, its emergence."""
    if subject.family == "CatFormer":
        return catformer_blocks(subject.model, getattr(subject.task, "parents", None))
    res = block_structure(subject.model)
    series, source = None, None
    with tempfile.TemporaryDirectory() as tmp:
        if config.snapshots is not None:
            snaps, source = find_snapshots(config.snapshots), f"snapshots in {config.snapshots}"
        elif config.train_steps > 0:
            print(f"training a {config.train_steps}-step run with snapshots every {config.snapshot_every} steps ...")
            run_dir = train_short_run(Path(tmp), subject.name, config.train_steps, config.snapshot_every, config.seed)
            snaps, source = (
                find_snapshots(run_dir),
                f"a {config.train_steps}-step run of the training config, seed {config.seed}",
            )
        if source is not None:
            series = emergence(snaps)
    w_kq_abs = subject.model.W_KQ.detach().abs().cpu().double()
    return {**res, "emergence_source": source, "emergence": series, "w_kq_abs": w_kq_abs}


def record(r: dict) -> dict:
    """The JSON: every number but the tick labels and the |W_KQ| image."""
    if r.get("family") == "CatFormer":
        return r
    series = r["emergence"]
    return {
        **{k: v for k, v in r.items() if k not in ("labels", "w_kq_abs")},
        "emergence": None if series is None else [{k: v for k, v in s.items() if k != "labels"} for s in series],
    }


def _plot_catformer(r: dict, name: str):
    import matplotlib.pyplot as plt

    heads = r["heads"]
    fig, axes = plt.subplots(1, len(heads), figsize=(3.6 * len(heads), 3.6), squeeze=False)
    for ax, h in zip(axes[0], heads):
        im = ax.imshow(h["norms"], cmap="viridis")
        ticks = range(len(h["blocks"]))
        ax.set_xticks(ticks, h["blocks"], rotation=45, ha="right", fontsize=7)
        ax.set_yticks(ticks, h["blocks"], fontsize=7)
        ax.set(xlabel="key block", ylabel="query block", title=f"{h['head']}: |A| by block")
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.suptitle(f"{name}: CatFormer A, Frobenius norm of each residual block pair", fontsize=10)
    fig.tight_layout()
    return fig


def figures(result: common.Result) -> dict:
    r = result.data
    if r.get("family") == "CatFormer":
        return {NAME: _plot_catformer(r, result.title)}
    figs = {NAME: _plot_structure(r, result.title)}
    if r["emergence"] is not None:
        figs[f"{NAME}_emergence"] = _plot_emergence(r["emergence"], r["emergence_source"])
    return figs


def summary(r: dict) -> str:
    if r.get("family") == "CatFormer":
        lines = [f"{NAME} (CatFormer A, query block x key block norms):"]
        for h in r["heads"]:
            top = max(((q, k, v) for q, row in enumerate(h["norms"]) for k, v in enumerate(row)), key=lambda t: t[2])
            lines.append(f"  {h['head']}: largest block {h['blocks'][top[0]]} x {h['blocks'][top[1]]} ({top[2]:.3f})")
        if r["parent_attention"] is not None:
            lines.append(f"  layer 0's positional-block softmax on the parent (Nichani et al.'s measure): "
                         f"{r['parent_attention']:.3f} over {r['parent_edges']} edges")  # fmt: skip
        return "\n".join(lines)
    lines = [
        f"{NAME}: copy-subspace off/diag block-norm ratio {r['ratio']:.4f} (claim <= {CLAIM_RATIO}); "
        f"diag mean {r['diag_mean']:.3f}, off mean {r['off_mean']:.4f}, off max {r['off_max']:.4f}",
        f"  key-token row blocks (key x_h' vs query copies): mean {r['token_key_row'].mean():.4f} "
        f"({r['token_key_row_mean_over_diag']:.3f} of diag); query-token column: max {r['token_query_column'].max():.2g}",
    ]
    series = r["emergence"]
    if series:
        lines.append(
            f"  emergence ({r['emergence_source']}): ratio "
            + ", ".join(
                f"step {s['step']}: {s['ratio']:.3f}" for s in series[:: max(1, len(series) // 6)] + series[-1:]
            )
        )
    return "\n".join(lines)


ANALYSIS = common.register(globals())
