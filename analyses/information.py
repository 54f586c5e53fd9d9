"""Lemmas 2 to 4, exactly: mutual information on causal trees, the (strong) data-processing inequality,
and the expected log-likelihood that makes the true parent identifiable.

    python -m analyses.information                    # pi, root and H of the shipped task
    python -m analyses.information --n-contexts 400   # random trees per kernel

No sampling of tokens: every number is computed from pi, the root distribution and the tree
(``probes.information``). ``--n-contexts`` is the number of random trees. Three measurements:
(1) I(x_h; x_h') against tree distance on the shipped checkpoint's kernel; (2) the strong-DPI contraction
max over non-parents of I(x_h; x_h') / I(x_h; x_pa(h)) per kernel, for Dirichlet kernels with several
floors gamma, against its exact Dobrushin bound and Lemma 3's 1 - delta gamma (delta = smallest node
marginal, see ``probes.information``); (3) Lemma 4: E log pi(x_h | x_pa(h)) - max over non-parents of
E log pi(x_h | x_h') on that kernel. No --checkpoint: the kernel is ``models.DEFAULT_CHECKPOINT``'s.
"""

from __future__ import annotations

from analyses import common

NAME = "information"
REQUIRES = None  # its own synthetic tasks: no --checkpoint


class Config(common.Config):
    """What ``run`` computes: every field is also a flag."""

    n_contexts: int = common.n_contexts(200)


common.parse_first(globals())  # python -m: --help and a mistyped flag answer here, before torch is imported

import numpy as np
import torch

import models
from models.plumbing.progress import progress as progress_bar
from probes import MarkovTreeTask
from probes.information import expected_log_likelihood, mutual_information, pair_joints, sdpi_report, tree_distance

FIGURES = {
    "information.png": (
        "exact mutual information against tree distance; the strong-DPI contraction against the Dobrushin coefficient and the 1 - delta*gamma bound for kernels of different floors (no DPI violation); Lemma 4 margins, all positive."
    ),
}
GAMMAS = (0.02, 0.05, 0.1, 0.2, 0.4, 0.7)
TASK_NAME = "default"  # the kernel is models.DEFAULT_CHECKPOINT's


def _trees(task: MarkovTreeTask, n: int, seed: int) -> torch.Tensor:
    return task.sample_parents(n, torch.Generator().manual_seed(seed))


def measure(
    n_trees: int = 200,
    seq_len: int = 12,
    gammas=GAMMAS,
    kernels_per_gamma: int = 3,
    seed: int = 0,
    pi: torch.Tensor | None = None,
    root: torch.Tensor | None = None,
    progress: bool = False,
) -> dict:
    """The three measurements of the module docstring. ``pi``/``root`` default to a random d=5 kernel.

    Returns ``mi_by_distance`` (per tree distance: mean/min/max MI over pairs), ``pairs`` (distance and MI
    of every ordered pair h != h'), ``kernels`` (one dict per kernel: gamma, bound, delta, max_ratio,
    max_dobrushin), ``lemma4_margins`` (one per (tree, h >= 2)), ``dpi_violations`` and
    ``n_pairs_checked`` over every (tree, h, h' != pa(h)) of every kernel.
    """
    base = MarkovTreeTask.random(5, 1, seq_len, seed=seed) if pi is None else MarkovTreeTask(pi, 1, seq_len, root)
    d = base.d_vocab
    dist_all, mi_all, margins = [], [], []
    violations, checked = 0, 0
    for parents in progress_bar(_trees(base, n_trees, seed), "shipped kernel", enabled=progress):
        mi = mutual_information(pair_joints(base.pi, base.root, parents))
        dist = tree_distance(parents)
        off = ~torch.eye(seq_len, dtype=torch.bool)
        dist_all.append(dist[off])
        mi_all.append(mi[off])
        ell = expected_log_likelihood(base.pi, base.root, parents)
        for h in range(2, seq_len):
            others = torch.cat([ell[h, : parents[h]], ell[h, parents[h] + 1 : h]])
            margins.append((ell[h, parents[h]] - others.max()).item())
    dist_all, mi_all = torch.cat(dist_all), torch.cat(mi_all)
    by_dist = {"distance": [], "mean": [], "min": [], "max": []}
    for k in range(1, int(dist_all.max()) + 1):
        sel = mi_all[dist_all == k]
        by_dist["distance"].append(k)
        for key, f in (("mean", torch.mean), ("min", torch.min), ("max", torch.max)):
            by_dist[key].append(f(sel).item() if sel.numel() else float("nan"))
    kernels = []
    bar = progress_bar(desc="kernels", total=len(gammas) * kernels_per_gamma, enabled=progress)
    for gamma in gammas:
        for j in range(kernels_per_gamma):
            task = MarkovTreeTask.random(d, 1, seq_len, alpha=0.5, gamma=gamma, seed=seed + 1000 * j + 1)
            reps = [sdpi_report(task.pi, task.root, p) for p in _trees(task, n_trees, seed + j)]
            ratios = [r for rep in reps for r in rep["ratio"].values()]
            violations += sum(rep["dpi_slack"] < 0 for rep in reps)
            checked += sum(h - 1 for rep in reps for h in rep["ratio"])
            kernels.append(
                {
                    "gamma_floor": gamma,
                    "gamma": reps[0]["gamma"],
                    "delta": min(r["delta"] for r in reps),
                    "bound": max(r["bound"] for r in reps),
                    "max_ratio": max(ratios),
                    "mean_ratio": float(np.mean(ratios)),
                    "max_dobrushin": max(v for rep in reps for v in rep["dobrushin"].values()),
                }
            )
            bar.update()
    bar.close()
    return {
        "d_vocab": d,
        "seq_len": seq_len,
        "n_trees": n_trees,
        "pairs": {"distance": dist_all, "mi": mi_all},
        "mi_by_distance": by_dist,
        "kernels": kernels,
        "lemma4_margins": margins,
        "lemma4_min_margin": min(margins),
        "dpi_violations": violations,
        "n_pairs_checked": checked,
    }


def figures(result: common.Result):
    res = result.data
    import matplotlib.pyplot as plt  # plotting stays off the import path of the CLI's --help

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    ax = axes[0]
    dist, mi = res["pairs"]["distance"].numpy(), res["pairs"]["mi"].numpy()
    jitter = np.random.default_rng(0).uniform(-0.2, 0.2, dist.shape)
    ax.scatter(dist + jitter, mi, s=2, alpha=0.15, color="C0", rasterized=True)
    bd = res["mi_by_distance"]
    ax.plot(bd["distance"], bd["mean"], "o-", color="C3", label="mean")
    ax.set_yscale("log")
    ax.set_xlabel("tree distance between h and h'")
    ax.set_ylabel("I(x_h; x_h') (nats, exact)")
    ax.set_title(f"(a) {TASK_NAME}: exact MI vs tree distance\n{res['n_trees']} random trees, H={res['seq_len']}")
    ax.legend()
    ax = axes[1]
    ks = res["kernels"]
    bound = np.array([k["bound"] for k in ks])
    for key, marker, label in (
        ("max_ratio", "o", "max I(x_h;x_h')/I(x_h;x_pa)"),
        ("max_dobrushin", "x", "max Dobrushin coeff. of P(x_h'|x_pa)"),
    ):  # both coloured by the kernel floor, on one colour scale
        sc = ax.scatter(
            bound, [k[key] for k in ks], c=[k["gamma"] for k in ks], cmap="viridis", marker=marker, label=label
        )
    ax.plot([bound.min(), 1], [bound.min(), 1], "k--", lw=1, label="y = 1 − δγ")
    ax.set_xlabel("Lemma 3 bound 1 − δγ")
    ax.set_ylabel("contraction")
    ax.set_ylim(0, 1.02)
    fig.colorbar(sc, ax=ax, label="kernel floor γ = d·min π")
    ax.set_title(
        f"(b) strong DPI over non-parents: {len(ks)} kernels × {res['n_trees']} trees\n"
        f"DPI violations: {res['dpi_violations']} of {res['n_pairs_checked']} pairs"
    )
    ax.legend(fontsize=7, loc="center left")
    ax = axes[2]
    ax.hist(res["lemma4_margins"], bins=40, color="C2")
    ax.axvline(0, color="k", lw=1)
    ax.set_xlabel("E log π(x_h|x_pa(h)) − max_{h'≠pa} E log π(x_h|x_h')")
    ax.set_ylabel("(tree, h) pairs")
    ax.set_title(
        f"(c) Lemma 4, exact: min margin {res['lemma4_min_margin']:.2e}\n"
        f"{len(res['lemma4_margins'])} (tree, h ≥ 3) pairs"
    )
    fig.tight_layout()
    return fig


def compute(subject, config: Config) -> dict:
    """``measure`` on the shipped task's kernel, root and H, with --n-contexts random trees."""
    task = models.load_task(models.DEFAULT_CHECKPOINT)
    return measure(config.n_contexts, task.seq_len, seed=config.seed, pi=task.pi, root=task.root, progress=True)


def summary(res: dict) -> str:
    bd = res["mi_by_distance"]
    lines = [
        f"{NAME}: exact MI on {res['n_trees']} random trees (H={res['seq_len']}, d={res['d_vocab']})",
        "  mean I(x_h; x_h') by tree distance: "
        + ", ".join(f"{k}: {m:.2e}" for k, m in zip(bd["distance"], bd["mean"])),
        f"  DPI I(x_h;x_h') <= I(x_h;x_pa(h)): {res['dpi_violations']} violations of {res['n_pairs_checked']} pairs",
    ]
    for k in res["kernels"]:
        lines.append(
            f"  gamma {k['gamma']:.3f} (floor {k['gamma_floor']}): max ratio {k['max_ratio']:.4f} <= max Dobrushin "
            f"{k['max_dobrushin']:.4f} <= 1 - delta*gamma = {k['bound']:.4f} (delta {k['delta']:.4f})"
        )
    lines.append(
        f"  Lemma 4: min margin of E log pi(x_h|x_pa) over the best non-parent = {res['lemma4_min_margin']:.3e}"
    )
    return "\n".join(lines)


ANALYSIS = common.register(globals())
