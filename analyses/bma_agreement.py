"""Theorems 1 and 2: the Theorem 1 construction converges to BMA as beta grows, and the layer-2
attention (BMA's and a trained model's) concentrates on the true parent as L grows.

    python -m analyses.bma_agreement
    python -m analyses.bma_agreement --train-L none          # BMA curve only, no training

Part 1 (Theorem 1): on fresh contexts of the checkpoint's task, the construction
``theorem1_model(pi, L, H, beta)`` (float64) against the BMA oracle for beta = 0.1 .. 100: the mean TV
between its blocks.1 attention and the BMA posterior (h >= 1), and its NLL minus BMA's NLL.
Part 2 (Theorem 2): for a range of L on the same kernel pi, the mean posterior mass on the true parent
and parent-identification accuracy (argmax = true parent) of BMA (closed form, many L) and of models
TRAINED for each L in ``--train-L`` (short runs of the checkpoint's training config, ``--train-steps``).
"""

from __future__ import annotations

from analyses import common

NAME = "bma_agreement"
BMA_LENGTHS = (1, 2, 4, 8, 16, 32, 64)


REQUIRES = frozenset({common.DISENTANGLED, common.MARKOV_TASK})  # what it needs of its subject
MAX_L = 65536  # probes.tasks.MAX_N_EXAMPLES (that module loads torch)


class Config(common.Config):
    """What ``run`` computes: every field is also a flag."""

    n_contexts: int = common.n_contexts(2048)
    bma_lengths: tuple[int, ...] = common.option(BMA_LENGTHS, "L values for the BMA curve (comma-separated, or "
                                                 "none)", flag="bma_L", sep=",", minimum=1, maximum=MAX_L)  # fmt: skip
    train_lengths: tuple[int, ...] = common.option((1, 4, 16), "L values to train a model for (comma-separated, or "
                                                   "none: skip)", flag="train_L", sep=",", minimum=1, maximum=MAX_L)  # fmt: skip
    train_steps: int = common.option(300, "training steps per L", minimum=1, maximum=10**7)

common.parse_first(globals())  # python -m: --help and a mistyped flag answer here, before torch is imported

import dataclasses
import tempfile
from pathlib import Path

import numpy as np
import torch

import models
from analyses.common import sample_contexts
from models.plumbing.io import check_memory
from models.plumbing.progress import progress as progress_bar
from models.training.evaluate import output_and_pattern
from models.training.short_run import training_config
from models.training.train import train
from probes import MarkovTreeTask, bma_posterior, bma_predictive, mean_tv, parent_accuracy, target_nll
from probes.metrics import parent_mass

FIGURES = {
    "bma_agreement.png": (
        "Theorem 1: TV and NLL gap to BMA against beta (log-log, down to float64 precision); Theorem 2: BMA's and trained models' attention on the true parent and parent accuracy against L."
    ),
}
BETAS = tuple(float(b) for b in np.logspace(-1, 2, 13))


@torch.no_grad()
def attention_and_nll(model, tokens: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The blocks.1 attention ``[batch, H, H]`` (float64) and the model's target NLL on ``tokens``."""
    log_probs, attention = output_and_pattern(model, tokens)
    return attention, target_nll(log_probs.cpu(), tokens)


def theorem1_sweep(task: MarkovTreeTask, tokens: torch.Tensor, betas=BETAS, progress: bool = True) -> dict:
    """TV to the BMA posterior, max |attention - posterior| and NLL gap to BMA of the Theorem 1 model
    at each beta (float64), on ``tokens`` of ``task``."""
    L, H = task.n_examples, task.seq_len
    posterior = bma_posterior(task.pi, tokens, L, H)
    nll_bma = target_nll(bma_predictive(task.pi, tokens, L, H, task.root, log=True), tokens)
    rows = []
    for beta in progress_bar(betas, "beta", enabled=progress):
        attention, nll = attention_and_nll(models.theorem1_model(task.pi, L, H, beta, task.root), tokens)
        rows.append(
            {
                "beta": float(beta),
                "tv": mean_tv(attention, posterior),
                "max_abs": (attention - posterior)[:, 1:].abs().max().item(),
                "nll_gap": nll - nll_bma,
            }
        )
    return {"nll_bma": nll_bma, "sweep": rows}


def bma_vs_length(pi: torch.Tensor, seq_len: int, lengths, n_contexts: int, seed: int, root=None) -> list[dict]:
    """BMA's mean posterior mass on the true parent and its parent accuracy for each L (fresh contexts)."""
    rows = []
    for L in lengths:
        task = MarkovTreeTask(pi, L, seq_len, root)
        tokens, parents = sample_contexts(task, n_contexts, seed)
        post = bma_posterior(pi, tokens, L, seq_len)
        rows.append({"L": L, "parent_mass": parent_mass(post, parents), "parent_acc": parent_accuracy(post, parents)})
    return rows


def trained_vs_length(
    train_config, lengths, steps: int, n_contexts: int, seed: int, folder: Path, progress: bool = True
) -> list[dict]:
    """Train one model per L (``train_config`` with ``n_examples = L``, K = L, ``steps`` steps) and
    measure its attention on the true parent, parent accuracy, TV and NLL gap to BMA on fresh contexts."""
    rows = []
    for L in progress_bar(lengths, "train per L", enabled=progress):
        cfg = dataclasses.replace(
            train_config,
            n_examples=L,
            n_copy_heads=None,
            steps=steps,
            eval_every=steps,
            eval_contexts=256,
            snapshot_every=0,
            seed=seed,
            out=str(folder / f"L{L}"),
            resume=False,
        )
        model, _ = train(cfg, progress=False)
        task = cfg.task()
        tokens, parents = sample_contexts(task, n_contexts, seed + 1)
        attention, nll = attention_and_nll(model, tokens)
        post = bma_posterior(task.pi, tokens, L, task.seq_len)
        nll_bma = target_nll(bma_predictive(task.pi, tokens, L, task.seq_len, task.root, log=True), tokens)
        rows.append(
            {
                "L": L,
                "parent_mass": parent_mass(attention, parents),
                "parent_acc": parent_accuracy(attention, parents),
                "bma_parent_mass": parent_mass(post, parents),
                "bma_parent_acc": parent_accuracy(post, parents),
                "tv_to_bma": mean_tv(attention, post),
                "nll_gap": nll - nll_bma,
            }
        )
    return rows


def _plot(t1: dict, bma_rows: list[dict], trained: list[dict] | None, name: str, n: int, steps: int):
    import matplotlib.pyplot as plt

    fig, (a0, a1, a2) = plt.subplots(1, 3, figsize=(15, 4.4), layout="constrained")
    betas = [r["beta"] for r in t1["sweep"]]
    floor = np.finfo(np.float64).eps
    a0.loglog(betas, [max(r["tv"], floor) for r in t1["sweep"]], "o-", label="mean TV(attention, BMA posterior)")
    a0.loglog(betas, [max(abs(r["nll_gap"]), floor) for r in t1["sweep"]], "s-", label="|NLL − NLL_BMA| (nats)")
    a0.axhline(floor, color="0.5", ls=":", lw=1, label="float64 eps (values below clipped)")
    a0.set_xlabel("β (inverse temperature of the construction)")
    a0.set_ylabel("distance to BMA")
    a0.set_title(f"Theorem 1 model vs BMA\n({name} task, {n} contexts)", fontsize=10)
    a0.legend(fontsize=8)
    for ax, key, label in (
        (a1, "parent_mass", "mean attention on the true parent"),
        (a2, "parent_acc", "parent-identification accuracy"),
    ):
        ax.semilogx(
            [r["L"] for r in bma_rows], [r[key] for r in bma_rows], "o-", color="C0", label="BMA (closed form)", base=2
        )
        if trained:
            ax.semilogx(
                [r["L"] for r in trained],
                [r[key] for r in trained],
                "D",
                color="C3",
                ms=7,
                label=f"trained model ({steps} steps per L)",
                base=2,
            )
        ax.axhline(1.0, color="k", ls="--", lw=1, label="one-hot of the true parent")
        ax.set_xlabel("number of demonstrations L")
        ax.set_ylabel(label)
        ax.set_ylim(0, 1.05)
        ax.set_title(f"Theorem 2: {label} vs L\n({n} contexts per L)", fontsize=10)
        ax.legend(fontsize=8, loc="lower right")
    return fig


def compute(subject, config: Config) -> dict:
    task = subject.task
    if config.bma_lengths:  # BMA's posterior, float64 [n_contexts, H, (L+1) H], at the longest L, before any work
        L, H = max(config.bma_lengths), task.seq_len
        check_memory(config.n_contexts * H * (L + 1) * H * 8, f"--bma-L {L} with --n-contexts {config.n_contexts}")
    tokens, _ = sample_contexts(task, config.n_contexts, config.seed)
    t1 = theorem1_sweep(task, tokens)
    bma_rows = bma_vs_length(task.pi, task.seq_len, config.bma_lengths, config.n_contexts, config.seed, task.root)
    trained = None
    if config.train_lengths:
        with tempfile.TemporaryDirectory() as tmp:
            trained = trained_vs_length(
                training_config(subject.name),
                config.train_lengths,
                config.train_steps,
                config.n_contexts,
                config.seed,
                Path(tmp),
            )
    return {"theorem1": t1, "bma_vs_L": bma_rows, "trained_vs_L": trained, "train_steps": config.train_steps}


def figures(result: common.Result) -> dict:
    r = result.data
    return {
        NAME: _plot(
            r["theorem1"], r["bma_vs_L"], r["trained_vs_L"], result.title, result.config.n_contexts, r["train_steps"]
        )
    }


def summary(r: dict) -> str:
    lines = [f"{NAME}: Theorem 1 model vs BMA"]
    for row in r["theorem1"]["sweep"]:
        lines.append(
            f"  beta {row['beta']:8.3f}: TV {row['tv']:.3e}  max |attn - post| {row['max_abs']:.3e}  NLL gap {row['nll_gap']:+.3e}"
        )
    lines.append(
        "  BMA vs L: "
        + ", ".join(f"L={row['L']}: mass {row['parent_mass']:.3f} acc {row['parent_acc']:.3f}" for row in r["bma_vs_L"])
    )
    for row in r["trained_vs_L"] or []:
        lines.append(
            f"  trained L={row['L']} ({r['train_steps']} steps): mass on parent {row['parent_mass']:.3f} "
            f"(BMA {row['bma_parent_mass']:.3f}), acc {row['parent_acc']:.3f} (BMA {row['bma_parent_acc']:.3f}), "
            f"TV {row['tv_to_bma']:.3f}, NLL gap {row['nll_gap']:+.4f}"
        )
    return "\n".join(lines)


ANALYSIS = common.register(globals())
