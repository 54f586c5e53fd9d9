"""Training curves of a standard transformer and of the disentangled model on the same task.

    python -m analyses.standard_vs_disentangled                 # the models.standard defaults' task
    python -m analyses.standard_vs_disentangled --steps 4000    # as long as the shipped standard recipe

Both models train from scratch here on the task of the ``models.standard`` defaults (d=5, L=6, H=6,
rows 0.95 Dirichlet(0.3) + 0.05/d): the standard GPT-2 with the ``models.standard`` recipe, the
disentangled two-layer model with the ``models.train`` recipe. Both are evaluated every ``--eval-every``
steps on the same ``--n-contexts`` held-out contexts (drawn from ``--seed``, which also seeds both
trainings); the figure shows their NLL gaps to BMA with the uniform-parent plateau as a line.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

from analyses import common
from models.standard import StandardConfig, train_standard
from models.train import TrainConfig, train

NAME = "standard_vs_disentangled"
FIGURES = {
    "standard_vs_disentangled.png": (
        "training curves (NLL gap to BMA, held-out contexts) of a small pre-norm GPT-2 and of the disentangled model on the same task, with BMA and the uniform-parent plateau as horizontal lines"
    ),
}


def curves(
    steps: int, eval_every: int, n_contexts: int, seed: int, device: str = "cpu", progress: bool = False
) -> dict:
    """Train both models for ``steps`` on the ``models.standard`` default task; their eval histories."""
    cfg = StandardConfig(steps=steps, eval_every=eval_every, eval_contexts=n_contexts, seed=seed, device=device)
    _, standard = train_standard(cfg, progress=progress, save=False)
    with tempfile.TemporaryDirectory() as tmp:
        tcfg = TrainConfig(
            d_vocab=cfg.d_vocab,
            n_examples=cfg.n_examples,
            seq_len=cfg.seq_len,
            alpha=cfg.alpha,
            gamma=cfg.gamma,
            task_seed=cfg.task_seed,
            seed=seed,
            steps=steps,
            eval_every=eval_every,
            eval_contexts=n_contexts,
            device=device,
            out=str(Path(tmp) / "disentangled"),
        )
        _, disentangled = train(tcfg, progress=progress)
    keys = ("step", "nll", "nll_bma", "nll_gap")
    return {
        "task": {k: getattr(cfg, k) for k in ("d_vocab", "n_examples", "seq_len", "alpha", "gamma", "task_seed")},
        "standard_config": dataclasses.asdict(cfg),
        "disentangled_config": dataclasses.asdict(tcfg),
        "standard": [{k: m[k] for k in (*keys, "progress", "seconds")} for m in standard],
        "disentangled": [{k: m[k] for k in (*keys, "seconds")} for m in disentangled],
        "plateau_gap": standard[-1]["plateau_gap"],
    }


def plot(res: dict):
    import matplotlib.pyplot as plt  # heavy; only when plotting

    s, t = res["standard_config"], res["task"]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name, marker, label in (
        ("standard", "o-", f"standard GPT-2 ({s['n_layers']} layers, {s['n_heads']} heads, width {s['d_model']})"),
        ("disentangled", "s-", "disentangled two-layer model"),
    ):
        ax.plot([m["step"] for m in res[name]], [m["nll_gap"] for m in res[name]], marker, ms=3, label=label)
    ax.axhline(0, color="k", lw=1, label="BMA")
    ax.axhline(res["plateau_gap"], color="C3", ls="--", lw=1, label="uniform-parent plateau")
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_ylim(bottom=0)
    ax.set(
        xlabel="training step",
        ylabel="NLL - NLL(BMA) (nats)",
        title=f"d={t['d_vocab']} L={t['n_examples']} H={t['seq_len']}, "
        f"rows {1 - t['gamma']:g} Dir({t['alpha']:g}) + {t['gamma']:g}/d",
    )
    ax.legend(fontsize=7)
    return fig


def compute(subject, args) -> dict:
    return curves(args.steps, args.eval_every, args.n_contexts, args.seed, args.device)


def summary(res: dict) -> str:
    s, d = res["standard"][-1], res["disentangled"][-1]
    return (
        f"{NAME}: after {s['step']} steps, NLL gap to BMA: standard {s['nll_gap']:+.4f} (progress "
        f"{s['progress']:.3f}, {s['seconds']:.0f} s), disentangled {d['nll_gap']:+.4f} ({d['seconds']:.0f} s); "
        f"plateau {res['plateau_gap']:+.4f}"
    )


def add_flags(parser) -> None:
    parser.add_argument("--steps", type=int, default=2000, help="training steps of each model (default: 2000)")
    parser.add_argument("--eval-every", type=int, default=100, help="steps between evaluations (default: 100)")


def check_flags(parser, args) -> None:
    if args.steps < 1 or args.eval_every < 1:
        parser.error(f"--steps and --eval-every must be >= 1, got {args.steps} and {args.eval_every}")


ANALYSIS = common.Analysis(
    NAME,
    __doc__,
    compute,
    lambda res, args: {NAME: plot(res)},
    summary,
    n_contexts=512,
    add_flags=add_flags,
    check_flags=check_flags,
)


def main(argv: list[str] | None = None) -> dict:
    return common.main(ANALYSIS, argv)


if __name__ == "__main__":
    common.run(main)
