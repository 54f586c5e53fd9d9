"""CAPE step 1 against in-context inference: how many samples each needs to find ONE fixed tree's parents.

    python -m analyses.cape_structure                  # default task (d=5, H=12), one tree, N in 20..1000
    python -m analyses.cape_structure --seed 1

One tree G (``parents``) is drawn from ``--seed`` and held fixed. For each N on one axis:

- CAPE step 1 (``probes.cape_structure``, linear f): structure learning from N i.i.d. sequences of the
  Markov-tree task on G (the H positions are the M features, each ONE-HOT encoded, d columns) and from N
  sequences of the continuous system (``probes.continuous``, d=4, rho=0.5) on G. Metrics against G: SHD,
  skeleton F1, parent accuracy (each node's incoming edge of largest |A|) and parent accuracy with the
  order given (the skeleton weight over i < j, the prior BMA has).
- BMA (``probes.bma_posterior``) on L = N demonstrations of G: argmax of the posterior, averaged over
  ``--n-contexts`` contexts; it knows pi and that pa(h) < h.
- The two-layer transformer: the shipped checkpoint at its L = 10, and Theorem 1 models
  ``models.theorem1_model(pi, L, H, 50)`` (the construction, not a trained model) at the other L.

BMA needs far fewer samples: it knows the mechanism pi and the tree prior (one parent per node, before it),
so each demonstration is a full likelihood term; structure learning must estimate the mechanism as well, and
its orientation is not identified in general (a tree has no v-structure, so only the skeleton is): the
"order given" curves hand it the order BMA's prior has.
``--checkpoint`` selects the task and the L = 10 model.
"""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from analyses.common import (
    analysis_parser,
    parse_common,
    run,
    save_figure,
    save_json,
    single_thread,
    style,
    subject_from_args,
)
from probes import bma_posterior, parent_accuracy
from probes.cape_structure import StructureConfig, continuous_data, learn_structure, markov_tree_data, structure_metrics
from probes.continuous import ContinuousTask

NAME = "cape_structure"
FIGURES = {
    "cape_structure.png": (
        "CAPE step 1 (structure learning, linear SEM + NOTEARS constraint) against BMA and the two-layer model "
        "on one fixed tree: parent accuracy, skeleton F1 and SHD against the number of samples N = L."
    ),
}
NS = (20, 50, 200, 1000)
LS = (2, 5, 10, 20, 50)
TAU = {"markov": 0.15, "continuous": 0.3}  # one-hot edge norms are smaller (pi is near uniform)


def model_parent_accuracy(model, tokens, parents) -> float:
    """Argmax of the second-layer attention (``blocks.1.attn.hook_pattern``) against the tree."""
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens.to(model.cfg.device), names_filter="blocks.1.attn.hook_pattern")
    return parent_accuracy(cache["blocks.1.attn.hook_pattern"][:, 0].double().cpu(), parents)


def compute(
    subject, seed: int = 0, n_contexts: int = 256, Ns=NS, Ls=LS, inner_steps: int = 50, repeats: int = 3, progress=True
) -> dict:
    """Every plotted number; ``subject`` gives the task (pi, H) and the L = n_examples model. Structure
    learning is run on ``repeats`` independent data draws per N (same tree); its metrics are their means."""
    import models
    from probes import MarkovTreeTask

    task = subject.task
    H = task.seq_len
    parents = task.sample_parents(1, torch.Generator().manual_seed(seed))[0]
    ctask = ContinuousTask.random(4, 1, H, rho=0.5, seed=seed)
    res = {"parents": parents.tolist(), "Ns": list(Ns), "Ls": list(Ls), "structure": {}, "bma": [], "model": []}
    for kind in ("markov", "continuous"):
        rows = []
        for N in tqdm(Ns, desc=f"structure learning ({kind})", disable=not progress):
            draws = []
            for r in range(repeats):
                data_seed = seed + 1 + 1000 * r
                X = (
                    markov_tree_data(task, parents, N, data_seed)
                    if kind == "markov"
                    else continuous_data(ctask, parents, N, data_seed)
                )
                out = learn_structure(X, StructureConfig(tau=TAU[kind], inner_steps=inner_steps, seed=seed))
                draws.append(structure_metrics(out["A"], parents))
            mean = {k: sum(d[k] for d in draws) / repeats for k in draws[0]}
            rows.append({"N": N, **mean, "draws": draws})
        res["structure"][kind] = rows
    fixed = parents.view(1, -1).expand(n_contexts, -1)
    for L in tqdm(Ls, desc="BMA and model", disable=not progress):
        t = MarkovTreeTask(task.pi, L, H, task.root)
        tokens, _ = t.sample(n_contexts, torch.Generator().manual_seed(seed + 2 + L), parents=fixed)
        res["bma"].append({"L": L, "parent_accuracy": parent_accuracy(bma_posterior(task.pi, tokens, L, H), fixed)})
        if L == task.n_examples:
            m, label = subject.model, f"trained ({subject.name})"
        else:
            m, label = models.theorem1_model(task.pi, L, H, 50.0, task.root), "Theorem 1 construction"
        res["model"].append({"L": L, "source": label, "parent_accuracy": model_parent_accuracy(m, tokens, fixed)})
    return res


def _plot(res: dict, n_contexts: int):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    colours = {"markov": "C0", "continuous": "C1"}
    for kind, rows in res["structure"].items():
        N = [r["N"] for r in rows]
        c = colours[kind]
        axes[0].plot(N, [r["parent_accuracy"] for r in rows], "o-", color=c, label=f"CAPE step 1, {kind}")
        axes[0].plot(
            N, [r["ordered_parent_accuracy"] for r in rows], "o:", color=c, label=f"CAPE step 1, {kind}, order given"
        )
        axes[1].plot(N, [r["skeleton_f1"] for r in rows], "o-", color=c, label=f"CAPE step 1, {kind}")
        axes[2].plot(N, [r["shd"] for r in rows], "o-", color=c, label=f"CAPE step 1, {kind}")
    axes[0].plot(
        [r["L"] for r in res["bma"]],
        [r["parent_accuracy"] for r in res["bma"]],
        "s-",
        color="k",
        label="BMA, Markov task (knows pi, pa(h) < h)",
    )
    for r in res["model"]:
        marker = "*" if r["source"].startswith("trained") else "^"
        axes[0].plot(r["L"], r["parent_accuracy"], marker, color="C3", ms=11 if marker == "*" else 7)
    axes[0].plot([], [], "^", color="C3", label="two-layer: Theorem 1 construction")
    axes[0].plot([], [], "*", color="C3", ms=11, label="two-layer: trained checkpoint (L=10)")
    H = len(res["parents"])
    axes[0].axhline(1 / (H - 1), color="grey", lw=0.8, ls="--", label="chance (1/(H-1))")
    for ax, title in zip(
        axes, ("parent accuracy", "skeleton F1 (structure learning)", f"SHD (true tree: {H - 1} edges)")
    ):
        ax.set_xscale("log")
        ax.set_xlabel("samples N (= demonstrations L)")
        ax.set_title(title)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.suptitle(
        f"One fixed tree (H={H}): CAPE step 1 from N samples (mean of {len(res['structure']['markov'][0]['draws'])} draws) "
        f"vs in-context BMA / two-layer model from L demonstrations ({n_contexts} contexts per L)"
    )
    fig.tight_layout()
    fig.legend(handles, labels, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=5)
    return fig


def main(argv: list[str] | None = None) -> dict:
    parser = analysis_parser(NAME, __doc__.split("\n\n")[0], n_contexts=256)
    parser.add_argument("--repeats", type=int, default=3, help="data draws per N for structure learning (default: 3)")
    parser.add_argument(
        "--inner-steps", type=int, default=50, help="L-BFGS iterations per augmented-Lagrangian step (default: 50)"
    )
    args = parse_common(parser, argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.inner_steps < 1:
        parser.error(f"--inner-steps must be >= 1, got {args.inner_steps}")
    subject = subject_from_args(args)
    with single_thread():
        res = compute(subject, args.seed, args.n_contexts, inner_steps=args.inner_steps, repeats=args.repeats)
    style()
    save_figure(_plot(res, args.n_contexts), args.out, NAME)
    save_json(args.out, NAME, res, args, subject)
    for kind, rows in res["structure"].items():
        print(
            f"CAPE step 1 ({kind}): "
            + ", ".join(
                f"N={r['N']}: parent {r['parent_accuracy']:.2f} / ordered {r['ordered_parent_accuracy']:.2f}, skeleton F1 {r['skeleton_f1']:.2f}, SHD {r['shd']:.1f}"
                for r in rows
            )
        )
    print("BMA: " + ", ".join(f"L={r['L']}: {r['parent_accuracy']:.3f}" for r in res["bma"]))
    print("two-layer: " + ", ".join(f"L={r['L']}: {r['parent_accuracy']:.3f} ({r['source']})" for r in res["model"]))
    return res


if __name__ == "__main__":
    run(main)
