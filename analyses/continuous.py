"""Proposition 2: on the continuous task no bilinear score equals BMA, but the gap closes as L grows.

    python -m analyses.continuous                       # d=4, H=8, rho=0.5, L in 1..16
    python -m analyses.continuous --rho 0.3 --n-contexts 2048

Task ``x_h = rho A^T x_pa(h) + sqrt(1 - rho^2) eta`` (``probes.continuous``); BMA's logit for candidate h'
is ``c1 sum_l x_h'^l . A x_h^l + c2 sum_l ||x_h'^l||^2``. For each L, on the same held-out contexts:

- BMA (exact): parent-identification accuracy (argmax of the posterior) and the squared error of its
  predictive mean;
- the best purely bilinear score ``sum_l x_h'^l . W x_h^l``: W fitted directly to BMA's posterior by
  minimising the cross-entropy to it (convex in W, L-BFGS, so this is the global optimum); its residual
  (mean TV to BMA), accuracy and squared error (predictive mean with its attention). Control: the same
  fit with the quadratic term allowed (W and c2 free) must reach BMA (residual ~ 0);
- the trained continuous transformer (``models.train --task-kind continuous``, a short run per L).

The fitted W is compared with A: cosine similarity and scale against c1. Why the gap closes: every
marginal is N(0, I), so ``sum_l ||x_h'^l||^2 = L d + O(sqrt(L))`` for every candidate; the quadratic
term becomes a shared constant plus O(sqrt L) noise while the bilinear term separates the parent by O(L).
It takes no ``--checkpoint`` (the task is synthetic); the JSON records the task instead.
"""

from __future__ import annotations

from analyses import common

NAME = "continuous"
REQUIRES = None  # its own synthetic tasks: no --checkpoint


class Config(common.Config):
    """What ``run`` computes: every field is also a flag."""

    n_contexts: int = common.n_contexts(1024)
    rho: float = common.option(0.5, "parent-to-child correlation rho of the Gaussian task, in (0, 1)")
    steps: int = common.option(300, "training steps per L", minimum=1, maximum=10**7)

    def validate(self):
        if not 0 < self.rho < 1:
            raise ValueError(f"rho must lie in (0, 1), got {self.rho}")

common.parse_first(globals())  # python -m: --help and a mistyped flag answer here, before torch is imported

import tempfile

import numpy as np
import torch

from models.plumbing.progress import progress as progress_bar
from models.training.evaluate import output_and_pattern
from models.training.train import TrainConfig, train
from probes import mean_tv, parent_accuracy
from probes.continuous import (
    ContinuousTask,
    gaussian_bma_posterior,
    gaussian_coefficients,
    predictive_mean,
    softmax_rows,
    target_mse,
)

FIGURES = {
    "continuous.png": (
        "Proposition 2: parent accuracy and prediction error of BMA, the best bilinear score and the trained model against L; the bilinear residual to BMA (bounded away from 0 at small L); the fitted W against A."
    ),
}
LS = (1, 2, 4, 8, 16)


def pair_features(task: ContinuousTask, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``M[b, h, h'] = sum_l x_h'^l (x_h^l)^T`` [B,H,H,d,d] (bilinear score = <M, W>) and the quadratic
    feature ``Q[b, h, h'] = sum_l ||x_h'^l||^2`` [B,H,H]."""
    L, H, d = task.n_examples, task.seq_len, task.d_vocab
    demos = x.double().view(-1, L + 1, H, d)[:, :L]
    M = torch.einsum("blgi,blhj->bhgij", demos, demos)
    Q = (demos**2).sum((1, 3)).unsqueeze(1).expand(-1, H, -1)
    return M, Q


def _scores(M, Q, W, c):
    H = M.shape[1]
    s = torch.einsum("bhgij,ij->bhg", M, W) + (c * Q if c is not None else 0)
    return s.masked_fill(~torch.ones(H, H, dtype=torch.bool).tril(-1), float("-inf"))


def fit_bilinear(task: ContinuousTask, x: torch.Tensor, quadratic: bool = False, iters: int = 200) -> dict:
    """The W (and, with ``quadratic``, the c) minimising the mean cross-entropy from BMA's posterior to
    ``softmax_h'(sum_l x_h'^l . W x_h^l [+ c sum_l ||x_h'^l||^2])`` over h >= 1 of contexts ``x``.
    Convex in (W, c); L-BFGS from 0. Returns W [d,d], c, and the final mean KL(BMA || fit)."""
    posterior = gaussian_bma_posterior(task, x)
    M, Q = pair_features(task, x)
    d = task.d_vocab
    W = torch.zeros(d, d, dtype=torch.float64, requires_grad=True)
    c = torch.zeros((), dtype=torch.float64, requires_grad=True) if quadratic else None
    opt = torch.optim.LBFGS(
        [W] + ([c] if quadratic else []),
        lr=1,
        max_iter=iters,
        tolerance_grad=1e-12,
        tolerance_change=1e-15,
        history_size=50,
        line_search_fn="strong_wolfe",
    )
    keep = posterior[:, 1:] > 0

    def kl():
        log_q = _scores(M, Q, W, c)[:, 1:].log_softmax(-1)
        p = posterior[:, 1:]
        return torch.where(keep, p * (p.clamp_min(1e-300).log() - log_q), 0.0).sum(-1).mean()

    def closure():
        opt.zero_grad()
        loss = kl()
        loss.backward()
        return loss

    opt.step(closure)
    return {"W": W.detach(), "c": None if c is None else c.item(), "kl": kl().item()}


def bilinear_attention(task: ContinuousTask, x: torch.Tensor, W: torch.Tensor, c: float | None = None) -> torch.Tensor:
    """The attention [B,H,H] of the score ``sum_l x_h'^l . W x_h^l (+ c sum_l ||x_h'^l||^2)``."""
    M, Q = pair_features(task, x)
    return softmax_rows(_scores(M, Q, W, c))


def _train(task: ContinuousTask, steps: int, seed: int):
    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig(
            d_vocab=task.d_vocab,
            n_examples=task.n_examples,
            seq_len=task.seq_len,
            task_kind="continuous",
            rho=task.rho,
            task_seed=seed,
            seed=seed,
            steps=steps,
            eval_every=steps,
            eval_contexts=256,
            out=tmp,
        )
        model, _ = train(cfg, progress=False)
    return model


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a * b).sum() / (a.norm() * b.norm())).item()


@torch.no_grad()
def _measure(task, x, parents, attention) -> dict:
    return {
        "parent_acc": parent_accuracy(attention, parents),
        "mse": target_mse(predictive_mean(task, x, attention), x, task.seq_len),
    }


def measure(
    Ls=LS,
    d: int = 4,
    seq_len: int = 8,
    rho: float = 0.5,
    n_eval: int = 1024,
    n_fit: int = 1024,
    steps: int = 300,
    seed: int = 0,
    train_model: bool = True,
    progress: bool = False,
) -> dict:
    """Per L: BMA, the best bilinear fit (and the bilinear + quadratic control), the trained model."""
    out = {
        "L": list(Ls),
        "d": d,
        "seq_len": seq_len,
        "rho": rho,
        "c1": gaussian_coefficients(rho)[0],
        "c2": gaussian_coefficients(rho)[1],
        "bma": [],
        "bilinear": [],
        "quadratic_control": [],
        "trained": [],
    }
    for L in progress_bar(Ls, "L", enabled=progress):
        task = ContinuousTask.random(d, L, seq_len, rho, seed)  # the same A for every L (seed only)
        x, parents = task.sample(n_eval, torch.Generator().manual_seed(seed + 1))
        x_fit, _ = task.sample(n_fit, torch.Generator().manual_seed(seed + 2))
        posterior = gaussian_bma_posterior(task, x)
        out["bma"].append(_measure(task, x, parents, posterior))
        fit = fit_bilinear(task, x_fit)
        att = bilinear_attention(task, x, fit["W"])
        out["bilinear"].append(
            {
                **_measure(task, x, parents, att),
                "kl_fit": fit["kl"],
                "tv_to_bma": mean_tv(att, posterior),
                "W": fit["W"],
                "cos_W_A": _cosine(fit["W"], task.A),
                "scale_over_c1": ((fit["W"] * task.A).sum() / d).item() / out["c1"],
            }
        )
        ctrl = fit_bilinear(task, x_fit, quadratic=True)
        att = bilinear_attention(task, x, ctrl["W"], ctrl["c"])
        out["quadratic_control"].append({"kl_fit": ctrl["kl"], "tv_to_bma": mean_tv(att, posterior), "c": ctrl["c"]})
        if train_model:
            model = _train(task, steps, seed)
            mean, att = output_and_pattern(model, x)
            K = model.cfg.n_copy_heads
            blocks = model.W_KQ.detach().double().view(K + 1, d, K + 1, d).diagonal(dim1=0, dim2=2)[..., 1:]
            out["trained"].append(
                {
                    "parent_acc": parent_accuracy(att, parents),
                    "tv_to_bma": mean_tv(att, posterior),
                    "mse": target_mse(mean.detach(), x, seq_len),
                    "cos_blocks_A": float(np.mean([_cosine(blocks[..., k], task.A) for k in range(K)])),
                }
            )
    out["A"] = task.A
    return out


def figures(result: common.Result):
    res = result.data
    import matplotlib.pyplot as plt  # plotting stays off the import path of the CLI's --help

    L = res["L"]
    fig, axes = plt.subplots(1, 4, figsize=(17, 4))
    rows = [
        ("bma", "BMA (exact)", "k", "o--"),
        ("bilinear", "best bilinear W (fit to BMA)", "C0", "s-"),
        ("trained", "trained transformer", "C3", "^-"),
    ]
    for key, label, color, fmt in rows:
        if res[key]:
            axes[0].plot(L, [r["parent_acc"] for r in res[key]], fmt, color=color, label=label)
            axes[1].plot(L, [r["mse"] for r in res[key]], fmt, color=color, label=label)
    axes[0].set_ylabel("parent-identification accuracy")
    axes[1].set_ylabel("squared error of the predicted mean")
    axes[0].set_title("(a) argmax attention = true parent")
    axes[1].set_title("(b) prediction error of the target")
    ax = axes[2]
    ax.plot(L, [r["tv_to_bma"] for r in res["bilinear"]], "s-", color="C0", label="best bilinear W")
    ax.plot(
        L,
        [max(r["tv_to_bma"], 1e-12) for r in res["quadratic_control"]],
        "x:",
        color="C2",
        label="bilinear + quadratic (control)",
    )
    if res["trained"]:
        ax.plot(L, [r["tv_to_bma"] for r in res["trained"]], "^-", color="C3", label="trained transformer")
    ax.set_yscale("log")
    ax.set_ylabel("mean TV to the BMA posterior")
    ax.set_title("(c) residual to BMA (0 only with the quadratic term)")
    for ax in axes[:3]:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("L (demonstrations)")
        ax.legend(fontsize=7)
    W = res["bilinear"][-1]["W"] / res["c1"]
    A = res["A"]
    panel = np.concatenate([A.numpy(), np.full((A.shape[0], 1), np.nan), W.numpy()], 1)
    vmax = np.nanmax(np.abs(panel))
    im = axes[3].imshow(panel, cmap="RdBu_r", vmin=-vmax, vmax=vmax)
    axes[3].set_xticks([])
    axes[3].set_yticks([])
    axes[3].set_title(f"(d) A (left) vs fitted W / c1 (right), L={L[-1]}\ncos = {res['bilinear'][-1]['cos_W_A']:.3f}")
    fig.colorbar(im, ax=axes[3], shrink=0.8)
    fig.suptitle(
        f"Proposition 2, continuous task d={res['d']}, H={res['seq_len']}, ρ={res['rho']}: "
        f"{res['n_eval']} held-out contexts per L"
    )
    fig.tight_layout()
    return fig


def compute(subject, config: Config) -> dict:
    """``measure`` with the CLI's --rho, --n-contexts (held-out contexts per L) and --steps."""
    res = measure(rho=config.rho, n_eval=config.n_contexts, steps=config.steps, seed=config.seed, progress=True)
    return {**res, "n_eval": config.n_contexts}


def summary(res: dict) -> str:
    lines = [
        f"{NAME}: d={res['d']}, H={res['seq_len']}, rho={res['rho']} (c1={res['c1']:.3f}, c2={res['c2']:.3f}), "
        f"{res['n_eval']} held-out contexts per L",
        "   L | acc BMA  bilinear  trained | mse BMA  bilinear  trained | TV bilinear (control)  trained | cos(W,A)",
    ]
    for i, L in enumerate(res["L"]):
        b, w, q, t = res["bma"][i], res["bilinear"][i], res["quadratic_control"][i], res["trained"][i]
        lines.append(
            f"  {L:2d} | {b['parent_acc']:.3f}    {w['parent_acc']:.3f}    {t['parent_acc']:.3f} | "
            f"{b['mse']:.4f}   {w['mse']:.4f}   {t['mse']:.4f} | {w['tv_to_bma']:.4f} ({q['tv_to_bma']:.1e})"
            f"      {t['tv_to_bma']:.4f} | {w['cos_W_A']:.3f}"
        )
    return "\n".join(lines)




ANALYSIS = common.register(globals())
