"""CAPE downstream (arXiv 2509.16629, its ablation table in miniature): predict one masked feature of a
linear-Gaussian causal system from the others with a small transformer, under nine positional schemes.

    python -m analyses.cape_downstream                     # M=12 features, d=2, rho=0.8, 3 model seeds
    python -m analyses.cape_downstream --model-seeds 5 --steps 1200 --variants all

Data: ONE fixed tree G (``parents`` from ``--seed``, pa(h) < h) over M = H = 12 features, the continuous
system of ``probes.continuous`` on it (``x_root ~ N(0, I_d)``, ``x_h = rho A^T x_pa(h) + sqrt(1 - rho^2) eta``,
one orthogonal A): N_train i.i.d. samples for training and structure learning, N_test for the test.
d = 2 and rho = 0.8: neighbours then explain most of a feature (a leaf's Bayes MSE is 1 - rho^2 = 0.36 per
coordinate against 1 for the marginal), so positional information has a large gap to close, and d = 2 keeps
the per-edge map A (a rotation or reflection) cheap to learn in the short training budget.

Task: per sample one feature, uniform, is masked (its token embedding replaced by a learned mask vector) and
the features are shown in a uniformly random slot order (a fresh permutation per sample), so a slot index
carries no information. Loss and metric: MSE per coordinate of the masked feature's vector. References:
the Bayes floor (the Gaussian conditional mean from the closed-form joint covariance, ``conditional_mse``)
and the marginal (predict 0: MSE 1).

Model: pre-LayerNorm transformer, 2 layers, d_model 32, 4 heads of d_head 8, MLP 64 (GELU), no causal mask;
token = linear embedding of x_v (or the mask vector); readout = linear head at the masked slot. Adam, lr 1e-2
with cosine decay, 300 steps of 64 samples (the ~75 s budget; not converged, see below). Variants:

1. ``none``: no positional information. 2. ``slot``: learned absolute PE indexed by SLOT (BERT style).
3. ``identity``: learned embedding of the feature's IDENTITY (scGPT's gene token), added.
4. ``cape``: rotary angles from CAPE steps 1-3 on the training data (``learn_structure`` on the N_train
   samples -> ``embed`` (n = d_head/2 = 4) -> ``phi = (pi/4) e``), tied to the feature, in every layer.
5. ``cape_oracle``: the same on the TRUE tree (step 1 skipped; edge weights ``||rho A^T||_F = rho sqrt(d)``).
6. ``cape_random`` (w/o structure learning): a random DAG with as many edges as the learned one and its
   edge weights shuffled onto them. 7. ``cape_euclidean`` (w/o hyperbolic): the step-2 loss with squared
   Euclidean distances and regulariser ``lambda_g sum_v pi_v |x_v|^2`` (plain gradient descent, same steps and
   learning rate), its points scaled by one factor so the largest norm equals the largest Poincare norm of
   the hyperbolic embedding of the same graph, then ``phi = (pi/4) x``: the same angle range.
8. ``cape_additive`` (w/o rotary): the learned graph's Poincare coordinates e_v through a learned linear map,
   added to the token. 9. ``identity_cape``: identity embedding AND the CAPE rotary (the paper's setting,
   where scGPT keeps its gene tokens and CAPE replaces the positional encoding).

Measured (``--seed`` 0, 1, 2, i.e. three trees; 300 steps; mean of 3 model seeds): without the identity
token no scheme gets near the floor (the masked token cannot tell which feature it is: CAPE 0.77 / 0.40 /
0.60, none 0.80 / 0.48 / 0.61, floor 0.28 / 0.28 / 0.26); the slot PE equals none. With the identity token,
CAPE learns faster (0.35 / 0.33 / 0.31 against 0.39 / 0.40 / 0.43), but at 1000 steps both sit at the floor
(seed 0: 0.284), so the gain is learning speed, not final error. Of the paper's ablations, the random DAG is
worse than the learned one on all three trees but by little (0.36 / 0.37 / 0.34); Euclidean equals
hyperbolic (0.34 / 0.33 / 0.31); additive is not worse than rotary (0.36 / 0.31 / 0.30), because the
coordinates also tell the token which feature it is. Differences between the CAPE variants are within about
two standard deviations of the model seeds. The masked token's layer-1 attention on its Markov blanket
(``blanket_attention``; uniform 0.15): CAPE alone 0.17 / 0.18 / 0.14; identity 0.30 / 0.26 / 0.30; identity +
CAPE 0.42 / 0.40 / 0.49; with a random DAG 0.44 / 0.35 / 0.47; additive 0.47 / 0.64 / 0.72.

The default run trains none, slot, identity, cape and ``identity_cape`` with the four ablations on top of the
identity token (``identity_cape_oracle`` ...); ``--variants all`` adds the ablations 5-8 without it.
``--n-contexts`` is N_test; it takes no ``--checkpoint``. Every variant trains from the same seeded
initialisation of the shared weights and the same stream of batches (masks and slot orders) per model seed.
"""

from __future__ import annotations

import time
from dataclasses import asdict

import torch

from analyses import common
from cape.downstream import (
    ALL_VARIANTS,
    LABELS,
    VARIANTS,
    DownstreamConfig,
    bayes_predict,
    blanket_attention,
    conditional_mse,
    fixed_tree_data,
    gather_view,
    markov_blanket,
    positional_inputs,
    sample_views,
    train_variant,
    tree_covariance,
    variant_parts,
)
from models.plumbing.io import UsageError

NAME = "cape_downstream"
REQUIRES = None  # its own synthetic tasks: no --checkpoint


class Config(common.Config):
    """What ``run`` computes: every field is also a flag."""

    n_contexts: int = common.n_contexts(2000, "test samples of the downstream task (N_test)", minimum=2)
    model_seeds: int = common.option(3, "model seeds per variant", minimum=1, maximum=1000)
    steps: int = common.option(DownstreamConfig.steps, "training steps of each downstream model", minimum=1,
                               maximum=10**7)  # fmt: skip
    n_train: int = common.option(DownstreamConfig.n_train, "training samples of the downstream task", minimum=2,
                                 maximum=10**7)  # fmt: skip
    variants: str = common.option("default", f"comma-separated subset of {','.join(ALL_VARIANTS)}, or default / all")

    def validate(self):
        unknown = [v for v in variant_list(self.variants) if v not in ALL_VARIANTS]
        if unknown:
            raise ValueError(f"variants: unknown {unknown}; expected names from {','.join(ALL_VARIANTS)}")
FIGURES = {
    "cape_downstream.png": (
        "CAPE downstream: test MSE of a masked feature (random slot order, one fixed tree, linear-Gaussian) for "
        "eight positional schemes plus identity+CAPE (mean +- std over model seeds), against the Bayes floor and "
        "the marginal; learning curves."
    ),
}


def measure(
    cfg: DownstreamConfig | None = None, seed: int = 0, model_seeds: int = 3, variants=VARIANTS, progress=True
) -> dict:
    """Every plotted number: per variant the test MSE per model seed, mean and std, and the learning curves;
    the Bayes floor (closed form and on the test set), the marginal, and the structure-learning metrics."""
    cfg = cfg or DownstreamConfig()
    cfg.check()
    unknown = [v for v in variants if v not in ALL_VARIANTS]
    if unknown or not variants:
        raise UsageError(f"unknown variants {unknown}; expected a non-empty subset of {', '.join(ALL_VARIANTS)}")
    if model_seeds < 1:
        raise UsageError(f"model_seeds must be >= 1, got {model_seeds}")
    t0 = time.perf_counter()
    task, parents, X = fixed_tree_data(cfg.M, cfg.d, cfg.rho, cfg.n_train + cfg.n_test, seed, seed + 1)
    Xtr, Xte = X[: cfg.n_train], X[cfg.n_train :]
    Sigma = tree_covariance(parents, cfg.rho, task.A)
    per_feature = conditional_mse(Sigma, cfg.d)
    feat, slot = sample_views(cfg.n_test, cfg.M, torch.Generator().manual_seed(seed + 2))
    xv = gather_view(Xte, feat)
    masked = feat[torch.arange(cfg.n_test), slot]
    bayes_test = (bayes_predict(Sigma, Xte, masked) - Xte[torch.arange(cfg.n_test), masked]).pow(2).mean().item()
    marginal_test = Xte[torch.arange(cfg.n_test), masked].pow(2).mean().item()
    phi, coords, info = positional_inputs(cfg, Xtr, parents, seed)
    if progress:
        print(f"  steps 1-3 and the ablations' graphs: {time.perf_counter() - t0:.1f} s")
    test = (xv.float(), feat, slot)
    res = {
        "config": asdict(cfg),
        "parents": parents.tolist(),
        "A": task.A,  # the orthogonal map of every edge
        "bayes_mse": per_feature.mean().item(),
        "bayes_mse_per_feature": per_feature,
        "bayes_mse_test": bayes_test,
        "marginal_mse": 1.0,
        "marginal_mse_test": marginal_test,
        **info,
        "variants": {},
    }
    masked_blanket = markov_blanket(parents)[masked].sum(-1)
    res["blanket_chance"] = (masked_blanket / cfg.M).mean().item()  # uniform attention over the M slots
    for variant in variants:
        runs, curves, blanket = [], [], []
        _, part = variant_parts(variant)
        for s in range(model_seeds):
            model, curve = train_variant(
                cfg, variant, Xtr, test, seed * 1000 + s, phi.get(part), coords if part == "cape_additive" else None
            )
            runs.append(curve[-1][1])
            curves.append(curve)
            blanket.append(blanket_attention(model, *test, parents))
        mse = torch.tensor(runs, dtype=torch.float64)
        res["variants"][variant] = {
            "mse": runs,
            "mean": mse.mean().item(),
            "std": mse.std().item() if model_seeds > 1 else 0.0,
            "steps": [c[0] for c in curves[0]],
            "curve_mean": torch.tensor([[c[1] for c in cv] for cv in curves]).mean(0).tolist(),
            "blanket_attention": torch.tensor(blanket).mean(0).tolist(),  # per layer, mean over model seeds
        }
        if progress:
            r = res["variants"][variant]
            print(f"  {variant:15s} MSE {r['mean']:.4f} +- {r['std']:.4f}  ({time.perf_counter() - t0:.1f} s)")
    return res


def figures(result: common.Result):
    res = result.data
    import matplotlib.pyplot as plt  # plotting stays off the import path of the CLI's --help
    from matplotlib.patches import Patch

    fig, (ax, ax2, ax3) = plt.subplots(
        1, 3, figsize=(19, 5.4), gridspec_kw={"width_ratios": [1.3, 1, 1.1]}, layout="constrained"
    )
    names = list(res["variants"])
    means = [res["variants"][v]["mean"] for v in names]
    stds = [res["variants"][v]["std"] for v in names]
    colours = [f"C{i}" for i in range(len(names))]
    ax.bar(range(len(names)), means, yerr=stds, color=colours, capsize=3)
    for i, (m, sd) in enumerate(zip(means, stds)):
        ax.text(i, m + sd + 0.01, f"{m:.3f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(names)), [LABELS[v] for v in names], rotation=35, ha="right")
    ax.axhline(res["bayes_mse"], color="k", ls="--", lw=1, label=f"Bayes floor {res['bayes_mse']:.3f}")
    ax.axhline(res["marginal_mse"], color="grey", ls="--", lw=1, label="marginal (predict 0) 1.0")
    ax.set_ylabel("test MSE per coordinate (masked feature)")
    s = res["structure"]
    ax.set_title(
        f"mean ± std over {len(res['variants'][names[0]]['mse'])} model seeds; CSL: SHD {s['shd']}, "
        f"skeleton F1 {s['skeleton_f1']:.2f}",
        fontsize=10,
    )
    ax.set_ylim(0, 1.3)  # headroom: the legend sits above the marginal line
    ax.legend(fontsize=8, loc="upper center", ncol=2)
    for v, c in zip(names, colours):
        r = res["variants"][v]
        ax2.plot(r["steps"], r["curve_mean"], color=c, label=LABELS[v])
    ax2.axhline(res["bayes_mse"], color="k", ls="--", lw=1)
    ax2.set_xlabel("training step")
    ax2.set_ylabel("test MSE (mean over seeds)")
    ax2.set_title("learning curves", fontsize=10)
    ax2.legend(fontsize=8, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.16))  # below: off the curves
    blanket = [res["variants"][v]["blanket_attention"] for v in names]
    width = 0.8 / len(blanket[0])
    for layer in range(len(blanket[0])):
        ax3.bar(
            [i + (layer - (len(blanket[0]) - 1) / 2) * width for i in range(len(names))],
            [b[layer] for b in blanket],
            width,
            color=colours,
            alpha=0.5 + 0.5 * layer / max(1, len(blanket[0]) - 1),
            edgecolor="k",
            lw=0.3,
        )
    chance = ax3.axhline(
        res["blanket_chance"], color="grey", ls="--", lw=1, label=f"uniform attention {res['blanket_chance']:.2f}"
    )
    n_layers = len(blanket[0])
    shades = [
        Patch(fc="0.45", alpha=0.5 + 0.5 * layer / max(1, n_layers - 1), ec="k", lw=0.3, label=f"layer {layer + 1}")
        for layer in range(n_layers)
    ]
    ax3.set_xticks(range(len(names)), [LABELS[v] for v in names], rotation=35, ha="right")
    ax3.set_ylim(0, 1)
    ax3.set_ylabel("attention on the Markov blanket")
    ax3.set_title(
        "masked token's attention on its parent + children\n(bars: layers, left to right; mean over heads)",
        fontsize=10,
    )
    ax3.legend(handles=[*shades, chance], fontsize=8, loc="upper left")
    c = res["config"]
    fig.suptitle(
        f"Masked-feature prediction, one fixed tree (M={c['M']}, d={c['d']}, rho={c['rho']}), random slot order, "
        f"N_train={c['n_train']}"
    )
    return fig


def variant_list(spec: str) -> tuple[str, ...]:
    """``--variants``: 'default', 'all' or comma-separated names."""
    return {"default": VARIANTS, "all": ALL_VARIANTS}.get(spec) or tuple(spec.split(","))


def compute(subject, config: Config) -> dict:
    """``measure`` with the CLI's --n-train, --n-contexts (N_test), --steps, --model-seeds, --variants."""
    cfg = DownstreamConfig(n_train=config.n_train, n_test=config.n_contexts, steps=config.steps)
    return measure(cfg, config.seed, config.model_seeds, variant_list(config.variants))


def summary(res: dict) -> str:
    s = res["structure"]
    lines = [
        f"Bayes floor {res['bayes_mse']:.4f} (on the test set {res['bayes_mse_test']:.4f}), "
        f"marginal 1 (on the test set {res['marginal_mse_test']:.4f})",
        f"structure learning (N={res['config']['n_train']}): SHD {s['shd']}, skeleton F1 {s['skeleton_f1']:.3f}, "
        f"{s['n_edges']} edges",
        f"masked token's attention on its Markov blanket (uniform: {res['blanket_chance']:.3f}):",
    ]
    for v, r in res["variants"].items():
        lines.append(
            f"  {v:24s} MSE {r['mean']:.4f}  blanket attention by layer "
            + ", ".join(f"{b:.3f}" for b in r["blanket_attention"])
        )
    for k, g in res["angles"].items():
        lines.append(
            f"  angles {k:15s} max {g['max_abs']:.3f}, min pair distance {g['min_pair_distance']:.3f}, "
            f"corr with true hops {g['corr_true_hops']:+.3f}"
        )
    return "\n".join(lines)


ANALYSIS = common.register(globals())
