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


def add_flags(parser) -> None:
    parser.add_argument(
        "--snapshots", default=None, help="run folder (or its snapshots/) of models.train --snapshot-every N"
    )
    parser.add_argument(
        "--train-steps",
        type=int,
        default=500,
        help="without --snapshots: steps of the short run to train (0: no emergence plot; default 500)",
    )
    parser.add_argument("--snapshot-every", type=int, default=50, help="snapshot interval of that run (default 50)")


REQUIRES = frozenset({common.BILINEAR})  # what it needs of its subject (the disentangled model or a CatFormer)


common.parse_first(globals())  # python -m: --help and a mistyped flag answer here, before torch is imported

import tempfile
from pathlib import Path

import numpy as np
import torch

import models
from models.interp.subject import head_label
from models.plumbing.progress import progress as progress_bar
from models.training.short_run import find_snapshots, train_short_run
from probes import head_assignment
from probes.metrics import block_norms, off_diagonal_ratio

FIGURES = {
    "block_structure.png": (
        "|W_KQ| as a (K+1) x (K+1) grid of d x d blocks and the norm of each block; the off-diagonal / diagonal ratio on the copy subspaces is in the title."
    ),
    "block_structure_emergence.png": (
        "how the block-diagonal W_KQ emerges over a short training run: diagonal, off-diagonal and key-token block norms, the ratio against the 0.1 claim, block-norm grids at four steps."
    ),
}
CLAIM_RATIO = 0.1  # off-diagonal / diagonal block norm on the copy subspaces of a trained model


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
        out.append({"step": step, **block_structure(models.load(path))})
    return out


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




def check_flags(parser, args) -> None:
    if args.train_steps < 0 or args.snapshot_every < 1:
        parser.error(
            f"need --train-steps >= 0 and --snapshot-every >= 1, got {args.train_steps} and {args.snapshot_every}"
        )


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
        d, T = model.cfg.d_vocab, model.cfg.n_ctx
        P = model.blocks[0].attn.A[0, d:, d:].detach().double().cpu()
        soft = P.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
        edges = [(i, ps[0]) for i, ps in enumerate(parents[:T]) if len(ps) == 1]
        if edges:
            out["parent_attention"] = sum(soft[i, p].item() for i, p in edges) / len(edges)
            out["parent_edges"] = len(edges)
    return out


def compute(subject, args) -> dict:
    """The block structure of the subject (with ``w_kq_abs``, |W_KQ|, for the figure) and, from
    ``--snapshots`` or a short training run, its emergence."""
    if subject.family == "CatFormer":
        return catformer_blocks(subject.model, getattr(subject.task, "parents", None))
    res = block_structure(subject.model)
    series, source = None, None
    with tempfile.TemporaryDirectory() as tmp:
        if args.snapshots is not None:
            snaps, source = find_snapshots(args.snapshots), f"snapshots in {args.snapshots}"
        elif args.train_steps > 0:
            print(f"training a {args.train_steps}-step run with snapshots every {args.snapshot_every} steps ...")
            run_dir = train_short_run(Path(tmp), args.checkpoint, args.train_steps, args.snapshot_every, args.seed)
            snaps, source = (
                find_snapshots(run_dir),
                f"a {args.train_steps}-step run of the training config, seed {args.seed}",
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


def figures(r: dict, args) -> dict:
    if r.get("family") == "CatFormer":
        return {NAME: _plot_catformer(r, args.subject_name)}
    figs = {NAME: _plot_structure(r, args.subject_name)}
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
