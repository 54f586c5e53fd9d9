"""Linear probes (``probes.linear``) on three pieces of the residual stream, each with held-out accuracy
next to a shuffled-label control:

1. copyers: decode x_h^l (demonstration l's token at position h) from each copyer head's output
   ``blocks.0.attn.hook_z`` at target position h, for every (head, demonstration) pair;
2. parent: decode pa(h) from the layer-2 query ``blocks.1.attn.hook_q`` at position h, per h;
3. standard: decode x_h^l from the residual of a standard transformer (``models.standard``) at the
   query position that predicts x_h (flat L*H + h - 1), after the embedding and after each layer.

    python -m analyses.linear_probes                       # shipped checkpoint + a small GPT-2 trained here
    python -m analyses.linear_probes --standard runs/standard
    python -m analyses.linear_probes --checkpoint standard  # the residual probes of a standard subject only
"""

from __future__ import annotations

from analyses import common
from models import cli
from models.plumbing.io import UsageError

NAME = "linear_probes"
REQUIRES = frozenset({common.MARKOV_TASK})  # what it needs of its subject


class Config(common.Config):
    """What ``run`` computes: every field is also a flag."""

    n_contexts: int = common.n_contexts(256)
    standard: str | None = common.option(None, "a standard transformer folder (default: train a small one here, "
                                         "~100 steps)", metavar="HF_FOLDER")  # fmt: skip

    def validate(self):
        if self.standard is not None:
            cli.check_path(self.standard, "standard", utf8=False)

    def reads(self) -> list[str]:
        """What the run reads beyond its subject (no output may be, or lie in, it)."""
        return [self.standard] if self.standard is not None else []

common.parse_first(globals())  # python -m: --help and a mistyped flag answer here, before torch is imported

import tempfile
from pathlib import Path

import torch
from torch import Tensor

import models
from models.interp.subject import DISENTANGLED, Subject, load_subject, subject_of
from models.plumbing.progress import progress as progress_bar
from models.training.standard import StandardConfig, train_standard
from probes import bma_posterior
from probes.linear import linear_probe
from probes.metrics import parent_hits

FIGURES = {
    "linear_probe_copyers.png": (
        "held-out accuracy decoding x_h^l from each copyer head's output, for every (head, demonstration) pair, beside the shuffled-label control."
    ),
    "linear_probe_parent.png": (
        "held-out accuracy decoding pa(h) from the layer-2 query per position, against the control, chance 1/h and BMA."
    ),
    "linear_probe_standard.png": (
        "held-out accuracy decoding x_h^l from a standard transformer's residual at each layer, beside the control."
    ),
}


def _probe(features: Tensor, labels: Tensor, n_classes: int, seed: int) -> dict:
    return linear_probe(features, labels, n_classes, seed=seed).to_dict()


@torch.no_grad()
def copyer_probes(model, task, n_contexts: int, seed: int) -> dict:
    """Accuracy [K, L] of decoding x_h^l from head k's copy u_h^k (positions pooled)."""
    tokens, _ = common.sample_contexts(task, n_contexts, seed)
    _, cache = model.run_with_cache(tokens, names_filter="blocks.0.attn.hook_z")
    z = cache["blocks.0.attn.hook_z"]  # [batch, H, K, d]
    demos = tokens.view(-1, task.n_examples + 1, task.seq_len)[:, : task.n_examples]  # [batch, L, H]
    K, L = z.shape[2], task.n_examples
    results = [[None] * L for _ in range(K)]
    for k, l in progress_bar([(k, l) for k in range(K) for l in range(L)], "copyer probes", leave=False):
        results[k][l] = _probe(z[:, :, k].flatten(0, 1), demos[:, l].flatten(), task.d_vocab, seed)
    return _matrix(results)


@torch.no_grad()
def parent_probes(model, task, n_contexts: int, seed: int) -> dict:
    """Per target position h >= 1: decode pa(h) from the layer-2 query; BMA's accuracy and chance."""
    tokens, parents = common.sample_contexts(task, n_contexts, seed)
    _, cache = model.run_with_cache(tokens, names_filter="blocks.1.attn.hook_q")
    q = cache["blocks.1.attn.hook_q"][:, :, 0]  # [batch, H, D]
    bma = parent_hits(bma_posterior(task.pi, tokens, task.n_examples, task.seq_len), parents).mean(0)  # [H-1]
    out = {"h": [], "probe": [], "bma_acc": bma.tolist(), "chance": []}
    for h in progress_bar(range(1, task.seq_len), "parent probes", leave=False):
        out["h"].append(h)
        out["probe"].append(_probe(q[:, h], parents[:, h], h, seed))
        out["chance"].append(1 / h)
    return out


@torch.no_grad()
def standard_probes(subject: Subject, n_contexts: int, seed: int) -> dict:
    """Accuracy [layer, L] of decoding x_h^l from a standard LM's residual at the query predicting x_h
    of the target (``Layout.prediction_positions``), h >= 1."""
    task, model = subject.task, subject.model
    tokens, _ = common.sample_contexts(task, n_contexts, seed)
    n_layers = model.cfg.n_layers
    names = ["blocks.0.hook_resid_pre"] + [f"blocks.{i}.hook_resid_post" for i in range(n_layers)]
    _, cache = model.run_with_cache(subject.layout.encode(tokens), names_filter=lambda n: n in names)
    pos = subject.layout.prediction_positions()[1:]
    demos = tokens.view(-1, task.n_examples + 1, task.seq_len)[:, : task.n_examples, 1:]  # [batch, L, H-1]
    results = [[None] * task.n_examples for _ in names]
    jobs = [(i, l) for i in range(len(names)) for l in range(task.n_examples)]
    for i, l in progress_bar(jobs, "standard probes", leave=False):
        resid = cache[names[i]][:, pos].double()
        results[i][l] = _probe(resid.flatten(0, 1), demos[:, l].flatten(), task.d_vocab, seed)
    return {"layers": ["embed"] + [f"after block {i}" for i in range(n_layers)], **_matrix(results)}


def _matrix(results: list[list[dict]]) -> dict:
    return {key: [[r[key] for r in row] for row in results] for key in ("test_acc", "control_acc", "majority_acc")}


def train_small_standard(seed: int, out: Path) -> Subject:
    """A small GPT-2 (2 layers, 4 heads, width 32) trained here for 100 steps, as a subject. Its recipe is
    pinned (the d=5, L=6, H=8 task with rows 0.8 Dirichlet(1) + 0.2/d, loss on the target tokens, warm-up
    50 then cosine to 5%), so the figure does not move with ``models.standard``'s defaults."""
    cfg = StandardConfig(
        seq_len=8, alpha=1.0, gamma=0.2, task_seed=0, batch_size=64, lr=3e-3,
        n_heads=4, d_model=32, d_mlp=128, steps=100, warmup=50,
        final_lr_fraction=0.05, loss_on="target", eval_every=100, eval_contexts=256, seed=seed, out=str(out),
    )  # fmt: skip
    train_standard(cfg, progress=False)
    return subject_of(models.load(out), cfg.task(), None, "standard trained here (100 steps)", "")


def figures(result: common.Result) -> dict:
    results = result.data
    import matplotlib.pyplot as plt
    import numpy as np

    n, out = result.config.n_contexts, {}
    if "copyers" in results:
        r = results["copyers"]
        acc, ctrl = np.array(r["test_acc"]), np.array(r["control_acc"])
        fig, axes = plt.subplots(1, 2, figsize=(10, 4), gridspec_kw={"width_ratios": [3, 2]})
        im = axes[0].imshow(acc, vmin=0, vmax=1, cmap="viridis")
        axes[0].grid(False)
        axes[0].set(xlabel="demonstration l", ylabel="copyer head", title="held-out accuracy decoding $x_h^l$")
        axes[0].set_yticks(range(acc.shape[0]), [f"L0H{k}" for k in range(acc.shape[0])])
        fig.colorbar(im, ax=axes[0])
        heads = np.arange(acc.shape[0])
        axes[1].bar(heads - 0.2, acc.max(1), 0.4, label="best demonstration")
        axes[1].bar(heads + 0.2, ctrl.max(1), 0.4, label="shuffled-label control")
        axes[1].axhline(np.mean(r["majority_acc"]), color="k", ls=":", label="majority class")
        axes[1].set_xticks(heads, [f"L0H{k}" for k in heads], rotation=90)
        axes[1].set(ylabel="held-out accuracy", ylim=(0, 1.02))
        axes[1].legend(fontsize=7)
        fig.suptitle(f"Linear probes on copyer outputs (blocks.0.attn.hook_z), {n} contexts", fontsize=10)
        out["linear_probe_copyers"] = fig
    if "parent" in results:
        r = results["parent"]
        fig, ax = plt.subplots(figsize=(6, 3.6))
        ax.plot(r["h"], [p["test_acc"] for p in r["probe"]], "o-", label="probe on layer-2 query")
        ax.plot(r["h"], [p["control_acc"] for p in r["probe"]], "s--", label="shuffled-label control")
        ax.plot(r["h"], r["bma_acc"], "k-", label="BMA posterior argmax")
        ax.plot(r["h"], r["chance"], "k:", label="chance 1/h")
        ax.set(
            xlabel="target position h",
            ylabel="held-out accuracy of pa(h)",
            title=f"Decoding the parent from blocks.1.attn.hook_q alone, {n} contexts",
        )
        ax.legend(fontsize=7)
        out["linear_probe_parent"] = fig
    if "standard" in results:
        r = results["standard"]
        acc, ctrl = np.array(r["test_acc"]), np.array(r["control_acc"])
        fig, axes = plt.subplots(1, 2, figsize=(11, 3.4), sharey=True)
        for ax, m, title in ((axes[0], acc, "held-out accuracy"), (axes[1], ctrl, "shuffled-label control")):
            im = ax.imshow(m, vmin=0, vmax=1, cmap="viridis", aspect="auto")
            ax.grid(False)
            ax.set_yticks(range(len(r["layers"])), r["layers"] if ax is axes[0] else [])
            ax.set(xlabel="demonstration l", title=title)
            for (i, j), v in np.ndenumerate(m):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="w")
        fig.colorbar(im, ax=axes)
        fig.suptitle(
            f"Standard transformer: decoding $x_h^l$ from the residual at the query predicting $x_h$, {n} contexts",
            fontsize=9,
        )
        out["linear_probe_standard"] = fig
    return out


def probes_of(subject: Subject, standard: Subject | None, n_contexts: int = 256, seed: int = 0) -> dict:
    """All probes that apply: copyer and parent probes on a disentangled subject, residual probes on
    the standard subject (``standard``, or the subject itself if it is one)."""
    results = {}
    if DISENTANGLED in subject.capabilities:
        results["copyers"] = copyer_probes(subject.model, subject.task, n_contexts, seed)
        results["parent"] = parent_probes(subject.model, subject.task, n_contexts, seed)
    else:
        standard = subject
    if standard is not None:
        results["standard"] = standard_probes(standard, n_contexts, seed)
    return results


def compute(subject: Subject, config: Config) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        standard = None
        if DISENTANGLED in subject.capabilities:
            if config.standard is not None:
                standard = load_subject(config.standard, subject.device)
                if DISENTANGLED in standard.capabilities:
                    raise UsageError(
                        f"--standard {config.standard!r} is a {standard.describe()}; expected a standard "
                        "transformer (a Hugging Face folder such as python -m models.standard writes)"
                    )
            else:
                standard = train_small_standard(config.seed, Path(tmp) / "standard")
        return probes_of(subject, standard, config.n_contexts, config.seed)


def summary(results: dict) -> str:
    lines = []
    for name, r in results.items():
        if name == "parent":
            for h, p in zip(r["h"], r["probe"]):
                lines.append(
                    f"pa({h}) from query: {p['test_acc']:.3f} (control {p['control_acc']:.3f}, chance {1 / h:.3f})"
                )
        else:
            acc = torch.tensor(r["test_acc"])
            lines.append(
                f"{name}: best held-out accuracy per row {[round(v, 3) for v in acc.max(1).values.tolist()]}, "
                f"max control {torch.tensor(r['control_acc']).max().item():.3f}"
            )
    return "\n".join(lines)




ANALYSIS = common.register(globals())
