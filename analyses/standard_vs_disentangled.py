"""Training curves of a standard transformer and of the disentangled model on the same task.

    python -m analyses.standard_vs_disentangled              # the shipped standard recipe's curve (about a minute)
    python -m analyses.standard_vs_disentangled --retrain    # retrain the standard recipe too (~10 min on one thread)

The standard curve is the evaluation history of the shipped checkpoint ``models/checkpoints/standard``
(its ``training.json``: the ``models.standard`` defaults), or with ``--retrain`` a fresh run of those
defaults. The disentangled two-layer model (the ``models.train`` recipe) trains here for
``--disentangled-steps`` on the same task and is evaluated on the same held-out contexts (the same
seed and count as the standard run), so the two curves and the uniform-parent plateau are comparable.
"""

from __future__ import annotations

from analyses import common
from models.plumbing.io import UsageError

NAME = "standard_vs_disentangled"


REQUIRES = None  # its own synthetic tasks: no --checkpoint


class Config(common.Config):
    """What ``run`` computes: every field is also a flag."""

    retrain: bool = common.option(False, "train the standard recipe here instead of reading it")
    disentangled_steps: int = common.option(1000, "training steps of the disentangled model", minimum=1, maximum=10**7)
    eval_every: int = common.option(100, "its steps between evaluations", minimum=1, maximum=10**7)
    device: str = common.option("cpu", "torch device to train on, e.g. cpu or cuda")

common.parse_first(globals())  # python -m: --help and a mistyped flag answer here, before torch is imported

import dataclasses
import json
import tempfile
from pathlib import Path

from models.loading.checkpoint import STANDARD_CHECKPOINT
from models.training.standard import TRAINING_JSON, StandardConfig, train_standard
from models.training.train import TrainConfig, train

FIGURES = {
    "standard_vs_disentangled.png": (
        "training curves (NLL gap to BMA on held-out contexts) of the shipped standard GPT-2 recipe and of the disentangled model on the same task, with BMA and the uniform-parent plateau as horizontal lines"
    ),
}
KEYS = ("step", "nll", "nll_bma", "nll_gap")


def shipped_history(folder: Path = STANDARD_CHECKPOINT) -> tuple[StandardConfig, list[dict]]:
    """The config and evaluation history that the shipped standard checkpoint was trained with."""
    path = Path(folder) / TRAINING_JSON
    if not path.is_file():
        raise UsageError(f"{path} does not exist; regenerate it with python -m models.standard --out {folder}")
    training = json.loads(path.read_text())
    return StandardConfig(**training["config"]), training["history"]


def curves(cfg: StandardConfig, standard: list[dict], disentangled_steps: int, eval_every: int) -> dict:
    """Train the disentangled model on ``cfg``'s task, evaluated on ``cfg``'s held-out contexts, beside
    the standard ``history``."""
    with tempfile.TemporaryDirectory() as tmp:
        tcfg = TrainConfig(
            d_vocab=cfg.d_vocab,
            n_examples=cfg.n_examples,
            seq_len=cfg.seq_len,
            alpha=cfg.alpha,
            gamma=cfg.gamma,
            task_seed=cfg.task_seed,
            seed=cfg.seed,  # the held-out contexts come from the seed: the same as the standard run's
            steps=disentangled_steps,
            eval_every=eval_every,
            eval_contexts=cfg.eval_contexts,
            device=cfg.device,
            out=str(Path(tmp) / "disentangled"),
        )
        _, disentangled = train(tcfg, progress=False)
    if abs(disentangled[-1]["nll_bma"] - standard[-1]["nll_bma"]) > 1e-9:
        raise UsageError("the two runs were not evaluated on the same held-out contexts (their BMA NLLs differ)")
    return {
        "task": {k: getattr(cfg, k) for k in ("d_vocab", "n_examples", "seq_len", "alpha", "gamma", "task_seed")},
        "standard_config": dataclasses.asdict(cfg),
        "disentangled_config": {k: v for k, v in dataclasses.asdict(tcfg).items() if k != "out"},  # not its temporary folder
        "standard": [{k: m[k] for k in (*KEYS, "progress", "seconds")} for m in standard],
        "disentangled": [{k: m[k] for k in (*KEYS, "seconds")} for m in disentangled],
        "plateau_gap": standard[-1]["plateau_gap"],
    }


def compute(subject, config: Config) -> dict:
    if config.retrain:
        cfg = StandardConfig(seed=config.seed, device=config.device)
        _, history = train_standard(cfg, progress=False, save=False)
    else:
        cfg, history = shipped_history()
    res = curves(cfg, history, config.disentangled_steps, config.eval_every)
    return {**res, "source": "retrained here" if config.retrain else str(STANDARD_CHECKPOINT / TRAINING_JSON)}


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
        f"rows {1 - t['gamma']:g} Dir({t['alpha']:g}) + {t['gamma']:g}/d, {s['eval_contexts']} held-out contexts",
    )
    ax.title.set_fontsize(8)
    ax.legend(fontsize=7)
    return fig


def summary(res: dict) -> str:
    s, d = res["standard"][-1], res["disentangled"][-1]
    return (
        f"{NAME}: NLL gap to BMA: standard {s['nll_gap']:+.4f} after {s['step']} steps (progress {s['progress']:.3f}; "
        f"{res['source']}), disentangled {d['nll_gap']:+.4f} after {d['step']} steps; plateau {res['plateau_gap']:+.4f}"
    )




def figures(result: common.Result):
    return plot(result.data)  # one figure, filed under NAME


ANALYSIS = common.register(globals())
