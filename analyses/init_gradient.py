"""Theorem 3: at initialisation (W_KQ = 0) the loss gradient already points at the true parent.

    python -m analyses.init_gradient                   # the shipped task (pi, L, H of models.DEFAULT_CHECKPOINT)
    python -m analyses.init_gradient --n-contexts 4096 # target samples per tree

Subject: the Theorem 1 copyers (beta = 30, sharp copies) with ``W_KQ = 0`` and the ``W_OV`` token
block ``log pi``, on the shipped checkpoint's task (no --checkpoint: nothing trained is probed). At
W_KQ = 0 the blocks.1 attention A is uniform over h' < h and the prediction is the mixture
``p = sum_h' A_h' v_h'`` with ``v_h' = pi(. | x_h')``, so

    d NLL / d s_{h,h'} = -A_h' (v_h'(x_h) / p(x_h) - 1),

where s is the blocks.1 attention score. We take the gradient by autograd through the hooked model
(``blocks.1.attn.hook_attn_scores`` keeps its grad) and check it against that closed form. Write
``g_{h,h'} = -dNLL/ds_{h,h'}`` (the direction gradient descent moves the score). Measured:

1. per tree G and position h: E_x[g_{h,h'}] over target sequences drawn from G, the true parent against
   every other candidate with a Bonferroni-corrected 95% interval on each paired difference;
2. the terms ``(h-1) E[g] = E[v_h'(x_h) / p(x_h)] - 1`` against the exact chi-square mutual
   information I_chi2(x_h; x_h') of the tree (``probes.information``);
3. against L: the score gradient does not depend on L at W_KQ = 0 (it sees only the target sequence),
   but the score change one gradient step on W_KQ makes, ``k_h'^T (-grad W_KQ) q_h``, sums over the L
   copied demonstrations; the fraction of single contexts where it is largest at the true parent;
4. a few hundred Adam steps on W_KQ alone from 0: how fast the true parent's score separates.
"""

from __future__ import annotations

from analyses import common

NAME = "init_gradient"
REQUIRES = None  # its own synthetic tasks: no --checkpoint
MAX_SAMPLES = 2**24  # n_trees x n_contexts target sequences (the default is 2**16): the work, chunked, is not memory


class Config(common.Config):
    """What ``run`` computes: every field is also a flag."""

    n_contexts: int = common.n_contexts(2048, "target sequences per tree")
    n_trees: int = common.option(32, "random trees for the expected gradient", minimum=1)  # with MAX_SAMPLES
    steps: int = common.option(300, "Adam steps on W_KQ from 0", minimum=1, maximum=100_000)

    def validate(self):
        if self.n_trees * self.n_contexts > MAX_SAMPLES:
            raise ValueError(f"n_trees {self.n_trees} x n_contexts {self.n_contexts} = {self.n_trees * self.n_contexts} "
                             f"target sequences, more than the bound of {MAX_SAMPLES} (2**24); use fewer")  # fmt: skip

common.parse_first(globals())  # python -m: --help and a mistyped flag answer here, before torch is imported

import math

import numpy as np
import torch

import models
from analyses.common import sample_contexts
from models import theorem1_model
from models.interp.interventions import Intervention
from models.plumbing.io import check_memory
from models.plumbing.progress import progress as progress_bar
from probes import bma_posterior, mean_tv, parent_accuracy
from probes.information import chi2_mutual_information, pair_joints
from probes.metrics import parent_mass

FIGURES = {
    "init_gradient.png": (
        "Theorem 3 at W_KQ = 0: expected score gradient against the exact chi-square mutual information; parent minus every other candidate with Bonferroni intervals (all above 0); single-context parent picks from one gradient step against L beside BMA; training W_KQ alone from 0."
    ),
}
BETA = 30.0  # copyer sharpness: exp(-2 beta) leakage, far below float64 resolution of the gradients
SCORES = "blocks.1.attn.hook_attn_scores"
TASK_NAME = "default"  # the task is models.DEFAULT_CHECKPOINT's


def init_model(task, n_examples: int | None = None):
    """Theorem 1 copyers and value map on ``task`` (L overridable) with W_KQ = 0."""
    model = theorem1_model(task.pi, n_examples or task.n_examples, task.seq_len, BETA, task.root)
    with torch.no_grad():
        model.W_KQ.zero_()
    return model


def score_gradients(model, tokens: torch.Tensor) -> dict:
    """Per-context ``dNLL/ds`` [B,H,H] by autograd (``autograd``) and by the closed form (``closed``),
    with the attention pattern [B,H,H]. The NLL is summed over contexts and positions h >= 1, so each
    entry is one context's gradient; masked entries (h' >= h) are 0."""
    kept: dict = {}
    model.zero_grad(set_to_none=True)
    with model.hooks(fwd_hooks=[Intervention(SCORES, "record", store=kept).fwd_hook()]):
        log_probs, cache = model.run_with_cache(
            tokens, names_filter=["blocks.1.attn.hook_pattern", "blocks.1.attn.hook_v"]
        )
    H = model.cfg.seq_len
    target = tokens[:, -H:].unsqueeze(-1)
    kept[SCORES].retain_grad()
    (-log_probs.gather(-1, target)[:, 1:].sum()).backward()
    grad = kept[SCORES].grad[:, 0].detach()
    A = cache["blocks.1.attn.hook_pattern"][:, 0].detach()  # [b, h, h']
    v = cache["blocks.1.attn.hook_v"][:, :, 0].detach().exp()  # [b, h', d]
    v_x = v.gather(-1, target.transpose(1, 2).expand(-1, H, -1))  # [b, h', h] = v_h'(x_h)
    v_x = v_x.transpose(1, 2)  # [b, h, h']
    p = (A * v_x).sum(-1, keepdim=True)
    closed = torch.where(A > 0, -A * (v_x / torch.where(A > 0, p, 1.0) - 1), 0.0)
    return {"autograd": grad, "closed": closed, "pattern": A}


def gradient_by_tree(task, n_trees: int, n_samples: int, seed: int, chunk: int = 2048, progress: bool = False) -> dict:
    """Expected ``g = -dNLL/ds`` per (tree, h, h') from ``n_samples`` target sequences per tree.

    Returns per (tree, h >= 2): ``mean`` [h] and the paired ``diff`` statistics (parent minus each
    other candidate: mean, standard error), the exact chi-square MI of every pair, the fraction of
    single contexts whose largest g is at the parent, and the worst |autograd - closed form|.
    """
    model = init_model(task)
    H = task.seq_len
    gen = torch.Generator().manual_seed(seed)
    trees = task.sample_parents(n_trees, gen)
    rows, worst, single_hits, single_total = [], 0.0, 0, 0
    for parents in progress_bar(trees, "trees", enabled=progress):
        sums = torch.zeros(H, H, dtype=torch.float64)
        sq = torch.zeros(H, H, H, dtype=torch.float64)  # [h, h', h''] second moments for paired differences
        done = 0
        while done < n_samples:
            b = min(chunk, n_samples - done)
            tokens, _ = task.sample(b, gen, parents=parents.expand(b, H))
            out = score_gradients(model, tokens)
            worst = max(worst, (out["autograd"] - out["closed"]).abs().max().item())
            g = -out["autograd"].double()
            sums += g.sum(0)
            sq += torch.einsum("bhi,bhj->hij", g, g)
            best = torch.where(out["pattern"] > 0, g, -torch.inf)[:, 2:].argmax(-1)
            single_hits += (best == parents[2:]).sum().item()
            single_total += best.numel()
            done += b
        mean = sums / n_samples
        cov = sq / n_samples - mean.unsqueeze(2) * mean.unsqueeze(1)
        chi2 = chi2_mutual_information(pair_joints(task.pi, task.root, parents))
        for h in range(2, H):
            pa = parents[h].item()
            others = [k for k in range(h) if k != pa]
            var = torch.tensor([cov[h, pa, pa] + cov[h, k, k] - 2 * cov[h, pa, k] for k in others]).clamp_min(0)
            rows.append(
                {
                    "h": h,
                    "parent": pa,
                    "mean": mean[h, :h].tolist(),
                    "chi2": chi2[h, :h].tolist(),
                    "others": others,
                    "diff": [(mean[h, pa] - mean[h, k]).item() for k in others],
                    "diff_se": (var / n_samples).sqrt().tolist(),
                }
            )
    n_comp = sum(len(r["others"]) for r in rows)
    z = _normal_quantile(1 - 0.025 / n_comp)  # Bonferroni over every comparison
    lower = [d - z * s for r in rows for d, s in zip(r["diff"], r["diff_se"])]
    return {
        "rows": rows,
        "n_trees": n_trees,
        "n_samples": n_samples,
        "n_comparisons": n_comp,
        "z": z,
        "min_lower": min(lower),
        "n_excluding_zero": sum(lo > 0 for lo in lower),
        "parent_largest_in_expectation": sum(
            max(range(r["h"]), key=lambda k: r["mean"][k]) == r["parent"] for r in rows
        )
        / len(rows),
        "single_context_parent_largest": single_hits / single_total,
        "max_abs_autograd_vs_closed": worst,
    }


def _normal_quantile(q: float) -> float:
    return math.sqrt(2) * torch.erfinv(torch.tensor(2 * q - 1, dtype=torch.float64)).item()


def one_step_against_L(task, Ls, n_batch: int, n_eval: int, seed: int, progress: bool = False) -> dict:
    """For each L: the population gradient of W_KQ at 0 (mean NLL over ``n_batch`` fresh contexts) and
    the score change ``Delta s = k^T (-grad) q`` it makes on ``n_eval`` held-out contexts. Reports the
    fraction of (context, h >= 2) whose largest Delta s (and largest per-context g) is at the parent,
    and BMA's parent accuracy at that L for reference."""
    out = {"L": list(Ls), "step_parent_acc": [], "score_grad_parent_acc": [], "bma_parent_acc": [], "step_margin": []}
    for L in progress_bar(Ls, "L", enabled=progress):
        model = init_model(task, L)
        lt = type(task)(task.pi, L, task.seq_len, task.root)
        tokens, _ = sample_contexts(lt, n_batch, seed)
        model.zero_grad(set_to_none=True)
        H = task.seq_len
        (-model(tokens).gather(-1, tokens[:, -H:].unsqueeze(-1))[:, 1:].mean()).backward()
        eval_tokens, parents = sample_contexts(lt, n_eval, seed + 1)
        g = -score_gradients(model, eval_tokens)["autograd"].double()
        with torch.no_grad():
            model.W_KQ.copy_(-model.W_KQ.grad / model.W_KQ.grad.norm())
            _, cache = model.run_with_cache(eval_tokens, names_filter=SCORES)
        ds = cache[SCORES][:, 0].double()  # [b, h, h'], -inf on h' >= h
        mask = torch.ones(H, H, dtype=torch.bool).tril(-1)
        out["step_margin"].append(_separation(ds, parents) / ds[:, mask].std().item())
        out["step_parent_acc"].append(_acc_from_h2(ds, parents))
        out["score_grad_parent_acc"].append(_acc_from_h2(torch.where(mask, g, -torch.inf), parents))
        out["bma_parent_acc"].append(_acc_from_h2(bma_posterior(task.pi, eval_tokens, L, H), parents))
    return out


def _separation(scores: torch.Tensor, parents: torch.Tensor) -> float:
    """Mean over (context, h >= 2) of the parent's score minus the mean score of the other candidates."""
    H = scores.shape[-1]
    finite = torch.isfinite(scores[:, 2:])
    at_parent = scores[:, 2:].gather(-1, parents[:, 2:].unsqueeze(-1)).squeeze(-1)
    others = (scores[:, 2:].masked_fill(~finite, 0).sum(-1) - at_parent) / torch.arange(1, H - 1).double()
    return (at_parent - others).mean().item()


def _acc_from_h2(scores: torch.Tensor, parents: torch.Tensor) -> float:
    """Fraction of (context, h >= 2) whose largest score is at the true parent (h = 1 has one candidate)."""
    return (scores[:, 2:].argmax(-1) == parents[:, 2:]).double().mean().item()


def train_from_zero(
    task, steps: int, batch: int, lr: float, n_eval: int, seed: int, every: int = 10, progress: bool = False
) -> dict:
    """Adam on W_KQ alone from 0 (copyers and W_OV frozen at Theorem 1). Every ``every`` steps on
    ``n_eval`` held-out contexts: mean score of the true parent minus the mean over other candidates,
    blocks.1 attention on the parent, parent accuracy, TV to the BMA posterior."""
    model = init_model(task)
    for p in model.parameters():
        p.requires_grad_(p is model.W_KQ)
    opt = torch.optim.Adam([model.W_KQ], lr=lr)
    gen = torch.Generator().manual_seed(seed)
    eval_tokens, parents = sample_contexts(task, n_eval, seed + 1)
    posterior = bma_posterior(task.pi, eval_tokens, task.n_examples, task.seq_len)
    H = task.seq_len
    hist = {"step": [], "separation": [], "parent_mass": [], "parent_acc": [], "tv_to_bma": []}
    for step in progress_bar(range(steps + 1), "train W_KQ", enabled=progress):
        if step % every == 0:
            with torch.no_grad():
                _, cache = model.run_with_cache(eval_tokens, names_filter=[SCORES, "blocks.1.attn.hook_pattern"])
            s, A = cache[SCORES][:, 0].double(), cache["blocks.1.attn.hook_pattern"][:, 0].double()
            hist["step"].append(step)
            hist["separation"].append(_separation(s, parents))
            hist["parent_mass"].append(parent_mass(A, parents))
            hist["parent_acc"].append(parent_accuracy(A, parents))
            hist["tv_to_bma"].append(mean_tv(A, posterior))
        if step == steps:
            break
        tokens, _ = task.sample(batch, gen)
        loss = -model(tokens).gather(-1, tokens[:, -H:].unsqueeze(-1))[:, 1:].mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    hist["bma_parent_acc"] = parent_accuracy(posterior, parents)
    hist["bma_parent_mass"] = parent_mass(posterior, parents)
    return hist


def measure(
    task,
    n_trees: int,
    n_samples: int,
    steps: int,
    Ls=(1, 2, 5, 10, 20),
    n_batch: int = 2048,
    n_eval: int = 1024,
    lr: float = 0.01,
    seed: int = 0,
    progress: bool = False,
) -> dict:
    """All four measurements of the module docstring on ``task``; ``steps``' default is the CLI's (``add_flags``)."""
    return {
        "n_eval": n_eval,
        "by_tree": gradient_by_tree(task, n_trees, n_samples, seed, progress=progress),
        "against_L": one_step_against_L(task, Ls, n_batch, n_eval, seed + 7, progress),
        "training": train_from_zero(task, steps, 256, lr, n_eval, seed + 11, progress=progress),
    }


def figures(result: common.Result):
    res = result.data
    import matplotlib.pyplot as plt  # plotting stays off the import path of the CLI's --help

    bt, al, tr = res["by_tree"], res["against_L"], res["training"]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    ax = axes[0, 0]
    for is_parent, color, label in ((False, "C0", "other candidates"), (True, "C3", "true parent")):
        xs, ys = [], []
        for r in bt["rows"]:
            for k in range(r["h"]):
                if (k == r["parent"]) == is_parent:
                    xs.append(max(r["chi2"][k], 1e-9))
                    ys.append(r["h"] * r["mean"][k])  # 0-based h has h candidates: (#candidates) E[g]
        ax.scatter(xs, ys, s=6, alpha=0.5, color=color, label=label)
    ax.set_xscale("log")
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xlabel("exact χ² mutual information I_χ²(x_h; x_h')")
    ax.set_ylabel("(#candidates) · E[−dNLL/ds_{h,h'}]")
    ax.set_title(
        f"(a) expected score gradient at W_KQ=0 vs χ²-MI\n{bt['n_trees']} trees × {bt['n_samples']} targets each"
    )
    ax.legend(fontsize=8)
    ax = axes[0, 1]
    diffs = sorted((d, s) for r in bt["rows"] for d, s in zip(r["diff"], r["diff_se"]))
    x = np.arange(len(diffs))
    d, s = np.array(diffs).T
    ax.fill_between(x, d - bt["z"] * s, d + bt["z"] * s, color="C0", alpha=0.3, label="Bonferroni 95% CI")
    ax.plot(x, d, color="C0", lw=1, label="E[g_parent] − E[g_h']")
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xlabel("(tree, h, h' ≠ pa(h)) comparisons, sorted")
    ax.set_ylabel("paired difference of expected −dNLL/ds")
    ax.set_title(
        f"(b) parent minus each other candidate: {bt['n_excluding_zero']}/{bt['n_comparisons']} CIs\n"
        f"exclude 0 (min lower bound {bt['min_lower']:.3g})"
    )
    ax.legend(fontsize=8)
    ax = axes[1, 0]
    ax.plot(al["L"], al["step_parent_acc"], "o-", label="one step on W_KQ: argmax Δs = parent")
    ax.plot(al["L"], al["score_grad_parent_acc"], "s-", label="per-context −dNLL/ds largest at parent")
    ax.plot(al["L"], al["bma_parent_acc"], "k--", label="BMA posterior argmax (reference)")
    ax.set_xscale("log")
    ax.set_xlabel("L (demonstrations)")
    ax.set_ylabel("fraction of (context, h ≥ 3)")
    ax.set_ylim(0, 1)
    ax.set_title(f"(c) single contexts where the gradient picks the parent\n{res['n_eval']} held-out contexts per L")
    ax.legend(fontsize=8)
    ax = axes[1, 1]
    ax.plot(tr["step"], tr["parent_acc"], color="C3", label="parent accuracy (blocks.1 argmax)")
    ax.plot(tr["step"], tr["parent_mass"], color="C1", label="attention on the true parent")
    ax.plot(tr["step"], tr["tv_to_bma"], color="C2", label="TV to BMA posterior")
    ax.axhline(tr["bma_parent_acc"], color="C3", ls="--", lw=1, label="BMA parent accuracy")
    ax.set_xlabel("Adam steps on W_KQ (everything else frozen)")
    ax.set_ylim(0, 1)
    ax2 = ax.twinx()
    ax2.plot(tr["step"], tr["separation"], color="k", lw=1, label="score(parent) − mean score(others)")
    ax2.set_ylabel("score separation", fontsize=9)
    ax2.grid(False)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="center right")
    ax.set_title(f"(d) training W_KQ from 0 at L={res['task']['L']}\n{res['n_eval']} held-out contexts")
    fig.suptitle(f"{TASK_NAME}: Theorem 3 at initialisation (Theorem 1 copyers, W_KQ = 0)")
    fig.tight_layout()
    return fig


def compute(subject, config: Config) -> dict:
    """``measure`` on the shipped task with the config's n_trees, n_contexts (targets per tree), steps."""
    task = models.load_task(models.DEFAULT_CHECKPOINT)
    # every tree's parents, int64 [n_trees, H], are drawn at once
    check_memory(config.n_trees * task.seq_len * 8, f"--n-trees {config.n_trees} (trees of {task.seq_len} positions)")
    res = measure(task, config.n_trees, config.n_contexts, steps=config.steps, seed=config.seed, progress=True)
    return {**res, "task": {"d": task.d_vocab, "L": task.n_examples, "H": task.seq_len}}  # for the titles


def summary(res: dict) -> str:
    bt, al, tr = res["by_tree"], res["against_L"], res["training"]
    d, L, H = res["task"]["d"], res["task"]["L"], res["task"]["H"]
    i = next((i for i, a in enumerate(tr["parent_acc"]) if a >= 0.9 * tr["bma_parent_acc"]), None)
    return "\n".join(
        [
            f"{NAME} on {TASK_NAME} (d={d}, L={L}, H={H}), W_KQ = 0:",
            f"  autograd vs closed form -A(v/p - 1): max |diff| = {bt['max_abs_autograd_vs_closed']:.2e}",
            f"  expected -dNLL/ds largest at the true parent for {bt['parent_largest_in_expectation']:.1%} of "
            f"{len(bt['rows'])} (tree, h) pairs; {bt['n_excluding_zero']}/{bt['n_comparisons']} paired differences "
            f"have a Bonferroni 95% CI above 0 (min lower bound {bt['min_lower']:.3g})",
            f"  single contexts with the largest -dNLL/ds at the parent: {bt['single_context_parent_largest']:.3f}",
            "  one gradient step on W_KQ, parent accuracy of the score change by L: "
            + ", ".join(
                f"L={L}: {a:.3f} (BMA {b:.3f})" for L, a, b in zip(al["L"], al["step_parent_acc"], al["bma_parent_acc"])
            ),
            f"  training W_KQ from 0: parent accuracy {tr['parent_acc'][0]:.3f} -> {tr['parent_acc'][-1]:.3f} "
            f"(BMA {tr['bma_parent_acc']:.3f}) in {tr['step'][-1]} steps; 90% of BMA's accuracy at step "
            f"{tr['step'][i] if i is not None else 'never'}; TV to BMA {tr['tv_to_bma'][-1]:.3f}",
        ]
    )




def record(res) -> dict:
    return {k: v for k, v in res.items() if k != "task"}


ANALYSIS = common.register(globals())
