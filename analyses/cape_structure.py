"""CAPE step 1 against in-context inference: how many samples each needs to find a fixed tree's parents.

    python -m analyses.cape_structure                  # default task (d=5, H=12), 3 trees, N in 20..500
    python -m analyses.cape_structure --n-trees 10 --seed 1

``--n-trees`` trees G are drawn from ``--seed``; each is held fixed while N (= L) varies, and every number is
the mean over the trees. On each tree:

- CAPE step 1 (``cape.structure``) with the linear f and the MLP f (not on one-hot features, where it
  can only overfit: any function of a one-hot vector is linear in it), from N i.i.d. samples of three
  systems on G (the H positions are the M features): the Markov-tree task (each feature ONE-HOT, d columns);
  the continuous system (``probes.continuous``, d=4, rho=0.5); and a scalar system whose edges are linear or
  quadratic (``nonlinear_tree_data``; a squared parent is uncorrelated with its child, so only the MLP f can
  see those edges). Metrics against G: SHD, skeleton F1, parent accuracy (each node's incoming edge of largest
  |A|) and parent accuracy with the order given (the skeleton weight over i < j, the prior BMA has).
- BMA on L = N demonstrations of G: the Markov task's (``probes.bma_posterior``) and the continuous system's
  Gaussian one (``probes.continuous.gaussian_bma_posterior``): argmax of the posterior, ``--n-contexts``
  contexts per tree and L. Both know the mechanism and that pa(h) < h.
- The model on the Markov task: the ``--checkpoint`` model at its own L (the shipped one: L = 10), and
  Theorem 1 models ``models.theorem1_model(pi, L, H, 50)`` (the construction, not a trained model) at the
  other L. Its parent pick is the argmax of the target queries' attention over the target sequence, from the
  head that puts the most mass on the true parent (measured per L; the disentangled model's is L1H0).

BMA needs far fewer samples: it knows the mechanism and the tree prior (one parent per node, before it), so
each demonstration is a full likelihood term; structure learning must estimate the mechanism as well, and
its orientation is not identified in general (a tree has no v-structure, so only the skeleton is): the
"order given" curves hand it the order BMA's prior has. ``--checkpoint`` (any model of a Markov-tree task)
selects the task and the model at its L.
"""

from __future__ import annotations

from analyses import common

NAME = "cape_structure"
REQUIRES = frozenset({common.MARKOV_TASK})  # what it needs of its subject


class Config(common.Config):
    """What ``run`` computes: every field is also a flag."""

    n_contexts: int = common.n_contexts(128, "contexts per tree and L")
    n_trees: int = common.option(3, "fixed trees to average over", minimum=1)  # bounded by memory (compute)
    inner_steps: int = common.option(50, "L-BFGS iterations per augmented-Lagrangian step", minimum=1, maximum=10**6)

common.parse_first(globals())  # python -m: --help and a mistyped flag answer here, before torch is imported

import numpy as np
import torch

import models
from cape.structure import (
    StructureConfig,
    continuous_data,
    learn_structure,
    markov_tree_data,
    nonlinear_tree_data,
    structure_metrics,
)
from models.interp.subject import DisentangledSubject, Subject, head_label
from models.plumbing.io import check_memory
from models.plumbing.progress import progress as progress_bar
from probes import MarkovTreeTask, bma_posterior, parent_accuracy
from probes.continuous import ContinuousTask, gaussian_bma_posterior
from probes.metrics import parent_mass

FIGURES = {
    "cape_structure.png": (
        "CAPE step 1 (structure learning: SEM with a linear or an MLP f + NOTEARS constraint) against BMA and the "
        "two-layer model, averaged over fixed trees: parent accuracy against the number of samples N = L on the "
        "Markov task, the continuous system and a system with quadratic edges, and skeleton F1."
    ),
}
NS = (20, 100, 500)
LS = (2, 5, 10, 20, 50)
KINDS = ("markov", "continuous", "nonlinear")
ENCODERS = ("linear", "mlp")
TAU = {"markov": 0.15, "continuous": 0.3, "nonlinear": 0.3}  # one-hot edge norms are smaller (pi is near uniform)
METRICS = ("shd", "skeleton_f1", "parent_accuracy", "ordered_parent_accuracy", "n_edges")


@torch.no_grad()
def model_parent_accuracy(subject: Subject, tokens, parents) -> tuple[float, str]:
    """Parent accuracy of the argmax of the target queries' attention over the target sequence, from the
    head with the most mass on the true parent; returns it and that head's label."""
    L, H = subject.task.n_examples, subject.task.seq_len
    best = (-1.0, 0.0, "")
    for layer, att in enumerate(subject.attention(tokens.to(subject.model.cfg.device))):
        rows = att.target_rows(L, H)[..., L * H :].cpu()  # [batch, head, H, H]: keys in the target sequence
        for head in range(rows.shape[1]):
            mass = parent_mass(rows[:, head], parents)
            if mass > best[0]:
                best = (mass, parent_accuracy(rows[:, head], parents), head_label(layer, head))
    return best[1], best[2]


def _data(kind: str, task, ctask, parents, N: int, seed: int) -> torch.Tensor:
    if kind == "markov":
        return markov_tree_data(task, parents, N, seed)
    if kind == "continuous":
        return continuous_data(ctask, parents, N, seed)
    return nonlinear_tree_data(parents, N, seed)


def _mean(rows: list[dict], keys) -> dict:
    return {k: float(np.mean([r[k] for r in rows])) for k in keys}


def measure(
    subject: Subject,
    seed: int = 0,
    n_contexts: int = 128,
    Ns=NS,
    Ls=LS,
    n_trees: int = 3,
    inner_steps: int = 50,
    encoders=ENCODERS,
    progress=True,
) -> dict:
    """Every plotted number; ``subject`` gives the task (pi, H) and the L = n_examples model. Structure
    learning gets one data draw per (tree, N); every metric is the mean over the ``n_trees`` trees, with the
    per-tree values kept under ``"per_tree"``."""
    task = subject.task
    H = task.seq_len
    trees = task.sample_parents(n_trees, torch.Generator().manual_seed(seed))
    ctasks = [ContinuousTask.random(4, 1, H, rho=0.5, seed=seed + t) for t in range(n_trees)]
    res = {"trees": trees.tolist(), "Ns": list(Ns), "Ls": list(Ls), "structure": {}, "bma": {}, "model": []}
    # On one-hot features any function of a node is linear in it, so the MLP f adds parameters, not
    # expressiveness (measured: it overfits, SHD 52 vs 23 at N = 100); it is skipped there.
    jobs = [(kind, f) for kind in KINDS for f in encoders if (kind, f) != ("markov", "mlp")]
    for kind, f in progress_bar(jobs, "structure learning", enabled=progress):
        rows = []
        for N in Ns:
            per_tree = []
            for t, parents in enumerate(trees):
                X = _data(kind, task, ctasks[t], parents, N, seed + 1 + 1000 * t)
                out = learn_structure(X, StructureConfig(tau=TAU[kind], inner_steps=inner_steps, seed=seed, f=f))
                per_tree.append(structure_metrics(out["A"], parents))
            rows.append({"N": N, **_mean(per_tree, METRICS), "per_tree": per_tree})
        res["structure"][f"{kind}/{f}"] = rows
    res["bma"] = {"markov": [], "continuous": []}
    for L in progress_bar(Ls, "BMA and model", enabled=progress):
        markov, gauss, model, source, heads = [], [], [], "", set()
        for t, parents in enumerate(trees):
            fixed = parents.view(1, -1).expand(n_contexts, -1)
            g = torch.Generator().manual_seed(seed + 2 + L + 1000 * t)
            task_L = MarkovTreeTask(task.pi, L, H, task.root)
            tokens, _ = task_L.sample(n_contexts, g, parents=fixed)
            markov.append(parent_accuracy(bma_posterior(task.pi, tokens, L, H), fixed))
            ct = ContinuousTask(ctasks[t].A, ctasks[t].rho, L, H)
            x, _ = ct.sample(n_contexts, g, parents=fixed)
            gauss.append(parent_accuracy(gaussian_bma_posterior(ct, x), fixed))
            if L == task.n_examples:
                m, source = subject, f"trained ({common.title_name(subject.name)})"
            else:
                construction = models.theorem1_model(task.pi, L, H, 50.0, task.root)
                m, source = DisentangledSubject(construction, task_L, "theorem1", ""), "Theorem 1 construction"
            accuracy, head = model_parent_accuracy(m, tokens, fixed)
            model.append(accuracy)
            heads.add(head)
        res["bma"]["markov"].append({"L": L, "parent_accuracy": float(np.mean(markov)), "per_tree": markov})
        res["bma"]["continuous"].append({"L": L, "parent_accuracy": float(np.mean(gauss)), "per_tree": gauss})
        res["model"].append(
            {
                "L": L,
                "source": source,
                "heads": sorted(heads),
                "parent_accuracy": float(np.mean(model)),
                "per_tree": model,
            }
        )
    return res


def figures(result: common.Result):
    res = result.data
    import matplotlib.pyplot as plt  # plotting stays off the import path of the CLI's --help

    fig, axes = plt.subplots(1, 4, figsize=(19, 4.3))
    colours = {"linear": "C0", "mlp": "C1"}
    titles = {
        "markov": "Markov task (one-hot features)",
        "continuous": "continuous system (d=4, rho=0.5)",
        "nonlinear": "scalar system, half the edges quadratic",
    }
    for ax, kind in zip(axes, KINDS):
        for key, rows in res["structure"].items():
            k, f = key.split("/")
            if k != kind:
                continue
            N = [r["N"] for r in rows]
            ax.plot(N, [r["parent_accuracy"] for r in rows], "o-", color=colours[f], label=f"CAPE step 1, {f} f")
            ax.plot(
                N, [r["ordered_parent_accuracy"] for r in rows], "o:", color=colours[f], label=f"{f} f, order given"
            )
            style_ = ("o-" if f == "linear" else "s--", {"markov": "C2", "continuous": "C4", "nonlinear": "C5"}[kind])
            axes[3].plot(N, [r["skeleton_f1"] for r in rows], style_[0], color=style_[1], label=f"{kind}, {f} f")
        if kind in res["bma"]:
            rows = res["bma"][kind]
            ax.plot(
                [r["L"] for r in rows],
                [r["parent_accuracy"] for r in rows],
                "s-",
                color="k",
                label="BMA (knows mechanism, pa(h) < h)",
            )
        if kind == "markov":
            for r in res["model"]:
                marker = "*" if r["source"].startswith("trained") else "^"
                ax.plot(r["L"], r["parent_accuracy"], marker, color="C3", ms=11 if marker == "*" else 7)
            ax.plot([], [], "^", color="C3", label="two-layer: Theorem 1 construction")
            for r in res["model"]:
                if r["source"].startswith("trained"):
                    ax.plot([], [], "*", color="C3", ms=11, label=f"{r['source']} at its L={r['L']}")
        H = len(res["trees"][0])
        ax.axhline(1 / (H - 1), color="grey", lw=0.8, ls="--")
        ax.set_title(titles[kind], fontsize=10)
        ax.set_ylabel("parent accuracy")
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=7, loc="lower right")
    axes[3].set_title("skeleton F1 (structure learning)", fontsize=10)
    axes[3].legend(fontsize=7, loc="lower right")
    ticks = sorted({*res["Ns"], *res["Ls"]})
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlim(min(ticks) / 1.3, max(ticks) * 1.3)
        ax.set_xlabel("samples N (= demonstrations L)")
    fig.suptitle(
        f"CAPE step 1 from N samples vs in-context BMA / two-layer model from L demonstrations: mean over "
        f"{len(res['trees'])} fixed trees (H={len(res['trees'][0])}; {result.config.n_contexts} contexts per tree and L; grey: chance)"
    )
    fig.tight_layout()
    return fig


def compute(subject: Subject, config: Config) -> dict:
    """``measure`` with the CLI's --n-contexts, --n-trees and --inner-steps, at ``LS`` and the subject's L."""
    Ls = tuple(sorted({*LS, subject.task.n_examples}))
    H = subject.task.seq_len  # every tree's parents, int64 [n_trees, H], are drawn at once
    check_memory(config.n_trees * H * 8, f"--n-trees {config.n_trees} (trees of {H} positions)")
    return measure(subject, config.seed, config.n_contexts, Ls=Ls, n_trees=config.n_trees, inner_steps=config.inner_steps)


def summary(res: dict) -> str:
    lines = []
    for key, rows in res["structure"].items():
        lines.append(
            f"CAPE step 1 ({key}): "
            + ", ".join(
                f"N={r['N']}: parent {r['parent_accuracy']:.2f} / ordered {r['ordered_parent_accuracy']:.2f}, "
                f"skeleton F1 {r['skeleton_f1']:.2f}, SHD {r['shd']:.1f}"
                for r in rows
            )
        )
    for kind, rows in res["bma"].items():
        lines.append(f"BMA ({kind}): " + ", ".join(f"L={r['L']}: {r['parent_accuracy']:.3f}" for r in rows))
    lines.append(
        "model: "
        + ", ".join(
            f"L={r['L']}: {r['parent_accuracy']:.3f} ({r['source']}, {'/'.join(r['heads'])})" for r in res["model"]
        )
    )
    return "\n".join(lines)




QUICK_CONFIG = {"n_trees": 1, "inner_steps": 5}  # tests/analyses/test_every_family.py: runs, on one tree
ANALYSIS = common.register(globals())
