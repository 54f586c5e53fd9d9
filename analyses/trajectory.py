"""How a model got there: its loss against Bayes and each simpler strategy, and the emergence of each
circuit part, over the snapshots of its training run, with the phases read off the numbers.

    python -m models.train --out runs/x --snapshot-every 50          # (or models.standard --snapshot-every 50)
    python -m analyses.trajectory --checkpoint runs/x                # reads runs/x/snapshots/step_XXXXXX/
    python -m analyses.trajectory --train-steps 200                  # a short run of the shipped config (the paper's)

Every snapshot is loaded as a ``Subject`` and measured on the same ``--n-contexts`` contexts (drawn with
``--seed`` from the run's task):

- the target NLL (h >= 1, nats) of the model and of each STRATEGY (``strategies``: uniform, unigram and
  bigram counts, ..., on our task the uniform-parent plateau, and the task's Bayes oracle,
  ``probes.oracles``), and the model's distance from each: the mean KL(strategy || model) of
  the predictive distributions over contexts and positions h >= 1; strategies that agree to 1e-9 on
  these contexts are one (``bigram=bayes``);
- PROGRESS from the plateau (0: the uniform-parent mixture on our task, the unigram strategy on the
  family's, ``probes.oracles.uniform_parent_predictive``) to Bayes (1),
  ``(NLL_plateau - NLL) / (NLL_plateau - NLL_Bayes)``;
- COPYING (layer 0): each head's attention from the query predicting x_h of the target, by
  demonstration (its purity: the largest mass on one demonstration; ``probes.demonstration_mass``) and
  the number of distinct demonstrations the heads attend to most;
- PARENT SELECTION: the head whose renormalised attention over the candidate parents is closest to the
  BMA posterior (TV; ``models.interp.baselines.head_attention_stats``) and its parent accuracy, beside BMA's
  and the uniform baseline's;
- per head, from the target queries (``probes.roles``): WITHIN-SEQUENCE mass (earlier positions of the
  target and its own) and CROSS-DEMONSTRATION mass (every position of the other sequences); and from
  every query (``probes.roles.sequence_scores``): the mass on the PREVIOUS TOKEN, on the tokens that
  followed earlier occurrences of the current one (INDUCTION, beside its chance level) and on the
  current token's PARENT.

PHASES (``phases``): at each snapshot the strategy the model is closest to (smallest KL); a phase is a
maximal run of snapshots with one closest strategy (runs shorter than ``--min-phase`` snapshots are
merged into the phase before them); a SWITCH is the first snapshot of a new phase, with the step where
the two strategies' KL curves cross (linear interpolation) and the loss drop across it. A switch is
SHARP when the steepest loss decrease per step in the intervals next to it is at least ``SHARP_RATIO``
times the median decrease per step over the run.
"""

from __future__ import annotations

from analyses import common
from models.plumbing.io import UsageError

NAME = "trajectory"


REQUIRES = frozenset({common.BAYES_TASK})  # what it needs of its subject


class Config(common.Config):
    """What ``run`` computes: every field is also a flag."""

    n_contexts: int = common.n_contexts(256, "contexts every snapshot is measured on")
    positions: str = common.positions_option("NLL, KL to each strategy and progress")
    train_steps: int = common.option(0, "train a short run of --checkpoint's training config (models.train) with "
                                     "snapshots and read those instead of --checkpoint's snapshots/ (0: read them)",
                                     minimum=0, maximum=10**7)  # fmt: skip
    snapshot_every: int = common.option(20, "with --train-steps: the snapshot interval", minimum=1, maximum=10**7)
    min_phase: int = common.option(1, "a phase lasts at least this many snapshots; shorter runs join the phase before",
                                   minimum=1, maximum=10**6)  # fmt: skip

common.parse_first(globals())  # python -m: --help and a mistyped flag answer here, before torch is imported

import math
import tempfile
from pathlib import Path

import torch
from jaxtyping import Float, Int
from torch import Tensor

from models.interp.baselines import baselines, head_attention_stats
from models.interp.subject import load_subject
from models.plumbing.progress import progress as progress_bar
from models.training.short_run import find_snapshots, train_short_run
from probes import MarkovTreeTask, demonstration_mass, oracles, target_nll
from probes.graph_task import context_order
from probes.metrics import scored_rows
from probes.oracles import uniform_parent_predictive
from probes.roles import role_profile, sequence_scores

PAPER_ARGS = ["--train-steps", "200", "--snapshot-every", "25", "--n-contexts", "128"]  # about 10 s of CPU
FIGURES = {
    "trajectory_loss.png": (
        "over training (a 200-step run of the shipped config): the model's target NLL beside each strategy's (uniform, "
        "unigram, bigram, stationary, the uniform-parent plateau, Bayes) and its KL "
        "from each; shaded: the phase (the strategy it is closest to), dashed: the detected switches."
    ),
    "trajectory_circuit.png": (
        "over training: progress from the plateau to Bayes, copyer purity and distinct demonstrations, the parent "
        "selector's TV to BMA and parent accuracy, each head's within-sequence and cross-demonstration attention mass, "
        "and its mass on the previous token, the current token's parent and the induction keys (beside chance)."
    ),
}
SAME = 1e-9  # strategies whose log-probabilities agree to this on the contexts are one
SHARP_RATIO = 3.0  # a switch is sharp if the loss falls this many times faster than the run's median


# The strategies ---------------------------------------------------------------------------------------
def strategies(task, tokens: Int[Tensor, "batch T"]) -> dict[str, Float[Tensor, "batch H d"]]:
    """Log-probabilities of the target tokens under each strategy of ``probes.oracles.strategies``
    (uniform, unigram, bigram, ..., Bayes) and, on our task, the uniform-parent plateau before Bayes."""
    out = oracles.strategies(task, tokens)
    if isinstance(task, MarkovTreeTask):
        bayes = out.pop("bayes")
        out["uniform-parent"] = uniform_parent_predictive(task, tokens)
        out["bayes"] = bayes
    return out


def merge_identical(strats: dict[str, Tensor]) -> dict[str, Tensor]:
    """Strategies equal to within ``SAME`` on these contexts under one name (``bigram=bayes``)."""
    groups: list[tuple[list[str], Tensor]] = []
    for name, lp in strats.items():
        for names, ref in groups:
            if (lp[:, 1:].double() - ref[:, 1:].double()).abs().max().item() <= SAME:  # h >= 1, as every measure
                names.append(name)
                break
        else:
            groups.append(([name], lp))
    return {"=".join(names): lp for names, lp in groups}


def kl_from(strategy: Float[Tensor, "batch H d"], model: Float[Tensor, "batch H d"], positions: str = "all") -> float:
    """Mean KL(strategy || model) over contexts and the target ``positions`` (``scored_rows``: h >= 1) (nats)."""
    p, q = strategy.double(), model.double()
    terms = torch.where(p > -torch.inf, p.exp() * (p - q), 0.0)  # 0 log 0 = 0
    return terms.sum(-1)[:, scored_rows(p.shape[1], positions)].mean().item()


# One snapshot -----------------------------------------------------------------------------------------
@torch.no_grad()
def measure(subject, tokens, parents, strats: dict[str, Tensor], base: dict, positions: str = "all") -> dict:
    """Every number of one snapshot (module docstring) on ``tokens`` (parents ``parents``); ``strats``
    (``merge_identical``) and ``base`` (``models.interp.baselines.baselines``) are shared by the snapshots; NLL,
    KL and progress over the target ``positions``."""
    task = subject.task
    L, H = task.n_examples, task.seq_len
    lp = subject.log_probs(tokens).cpu()
    nll = target_nll(lp, tokens, positions)
    layers = []
    for att in subject.attention(tokens):
        rows = att.target_rows(L, H).cpu()
        stats = head_attention_stats(rows, parents, base["posterior"], L, H)
        prof = role_profile(att.pattern, att.query_predicts, att.key_token, parents, L)
        seq = sequence_scores(att.pattern, att.query_predicts, att.key_token, tokens, parents, H, context_order(task))
        demo = demonstration_mass(rows.mean(0), L)[:, :L]  # [head, L]: mass on each demonstration
        layers.append({
            "purity": demo.max(-1).values.tolist() if L else [math.nan] * len(demo),  # L = 0: no demonstration
            "demonstration": demo.argmax(-1).tolist() if L else [-1] * len(demo),
            "tv": stats["tv"],
            "parent_acc": stats["parent_acc"],
            "candidate_mass": stats["candidate_mass"],
            "within_sequence": (prof["prefix"][:, 1] + prof["self"][:, 1]).tolist(),
            "cross_demonstration": (prof["same_position"][:, 1] + prof["other_position"][:, 1]).tolist(),
            **{name: v.tolist() for name, v in seq.items()},
        })  # fmt: skip
    tvs = [(tv, i, j) for i, layer in enumerate(layers) for j, tv in enumerate(layer["tv"])]
    _, li, hj = min(tvs)
    gap = base["nll_uniform"] - base["nll_bma"]
    return {
        "nll": nll,
        "kl": {name: kl_from(s, lp, positions) for name, s in strats.items()},
        "progress": (base["nll_uniform"] - nll) / gap if gap > 0 else float("nan"),
        "layers": layers,
        "copyer_purity": sum(layers[0]["purity"]) / len(layers[0]["purity"]),
        "distinct_demonstrations": len(set(layers[0]["demonstration"]) - {-1}),
        "selector": f"L{li}H{hj}",
        "selector_tv": layers[li]["tv"][hj],
        "selector_parent_acc": layers[li]["parent_acc"][hj],
    }


# Phases -----------------------------------------------------------------------------------------------
def phases(steps: list[int], kl: dict[str, list[float]], loss: list[float], min_phase: int = 1) -> dict:
    """The phases and switches of one run (module docstring): ``kl[name][i]`` is the model's distance
    from strategy ``name`` at ``steps[i]``, ``loss[i]`` its NLL there."""
    n = len(steps)
    if not n or any(len(v) != n for v in kl.values()) or len(loss) != n or not kl:
        raise ValueError(f"phases needs one KL per strategy and one loss per step; got {n} steps")
    closest = [min(kl, key=lambda s: kl[s][i]) for i in range(n)]
    runs: list[list] = []  # [strategy, first index, last index]
    for i, s in enumerate(closest):
        if runs and runs[-1][0] == s:
            runs[-1][2] = i
        else:
            runs.append([s, i, i])
    merged: list[list] = []
    for run in runs:
        short = run[2] - run[1] + 1 < min_phase
        if merged and (short or merged[-1][0] == run[0]):
            merged[-1][2] = run[2]
        else:
            merged.append(run)
    rates = [(loss[i - 1] - loss[i]) / (steps[i] - steps[i - 1]) for i in range(1, n)]
    typical = float(torch.tensor([abs(r) for r in rates]).median()) if rates else 0.0
    switches = []
    for prev, run in zip(merged, merged[1:]):
        i = run[1]
        old, new = kl[prev[0]], kl[run[0]]
        g0, g1 = new[i - 1] - old[i - 1], new[i] - old[i]  # > 0 before the crossing, <= 0 after
        cross = steps[i - 1] + (steps[i] - steps[i - 1]) * g0 / (g0 - g1) if g0 > g1 else float(steps[i])
        steepest = max(rates[j] for j in range(max(i - 2, 0), min(i + 1, n - 1)))
        switches.append({
            "step": steps[i],
            "after_step": steps[i - 1],
            "crossing": cross,
            "from": prev[0],
            "to": run[0],
            "loss_before": loss[i - 1],
            "loss_after": loss[i],
            "steepest_drop_per_step": steepest,
            "sharpness": steepest / typical if typical > 0 else float("inf"),
            "sharp": steepest > 0 and (typical == 0 or steepest >= SHARP_RATIO * typical),
        })  # fmt: skip
    return {
        "closest": closest,
        "phases": [{"strategy": s, "start": steps[a], "end": steps[b], "snapshots": b - a + 1} for s, a, b in merged],
        "switches": switches,
        "order": [s for s, _, _ in merged],
    }


# The run ----------------------------------------------------------------------------------------------
def run_snapshots(checkpoint: str) -> list[tuple[int, Path]]:
    """The ``(step, folder)`` snapshots of a run folder (``--checkpoint RUN``); one line if it has none."""
    folder = Path(checkpoint) / "snapshots"
    if not folder.is_dir():
        raise UsageError(
            f"--checkpoint {checkpoint} has no snapshots/ folder; expected the folder of a run trained with "
            f"models.train (or models.standard) --snapshot-every N"
        )
    return find_snapshots(folder)


def trajectory(subject, snapshots: list[tuple[int, Path]], n_contexts: int, seed: int, min_phase: int = 1,
               device: str = "cpu", progress: bool = True, positions: str | None = None) -> dict:  # fmt: skip
    """Every snapshot measured on the same contexts of ``subject``'s task, and the phases; NLL, KL and progress
    over the target ``positions`` (default: those ``subject`` was trained on)."""
    task = subject.task
    positions = subject.scored_positions(positions)
    tokens, parents = common.sample_contexts(task, n_contexts, seed)
    strats = merge_identical(strategies(task, tokens))
    base = baselines(task, tokens, parents, positions)
    rows = []
    for step, path in progress_bar(snapshots, "snapshots", enabled=progress):
        snap = load_subject(path, device)
        if snap.task.to_dict() != task.to_dict():
            raise UsageError(f"snapshot {path} was trained on another task than --checkpoint's; expected one run")
        if hasattr(snap.model, "eval"):
            snap.model.eval()
        rows.append({"step": step, **measure(snap, tokens, parents, strats, base, positions)})
    steps = [r["step"] for r in rows]
    found = phases(steps, {s: [r["kl"][s] for r in rows] for s in strats}, [r["nll"] for r in rows], min_phase)
    return {
        "family": subject.family,
        "positions": positions,  # the target positions every NLL, KL and progress here averages over
        "trained_on": subject.trained_on,
        "task": task.to_dict().get("spec") or task.to_dict().get("kind", "markov_tree"),
        "plateau": "uniform-parent" if isinstance(task, MarkovTreeTask) else "unigram",
        "n_contexts": n_contexts,
        "n_examples": task.n_examples,
        "strategies": {s: target_nll(lp, tokens, positions) for s, lp in strats.items()},
        "nll_bma": base["nll_bma"],
        "nll_uniform": base["nll_uniform"],
        "acc_bma": base["acc_bma"],
        "acc_uniform": base["acc_uniform"],
        "tv_uniform": base["tv_uniform"],
        "snapshots": rows,
        **found,
    }


def compute(subject, config: Config) -> dict:
    positions = subject.scored_positions(config.positions)
    if not config.train_steps:
        return trajectory(
            subject, run_snapshots(subject.name), config.n_contexts, config.seed, config.min_phase, subject.device,
            positions=positions,
        )
    with tempfile.TemporaryDirectory() as tmp:
        print(f"training a {config.train_steps}-step run with snapshots every {config.snapshot_every} steps ...")
        run = train_short_run(Path(tmp), subject.name, config.train_steps, config.snapshot_every, config.seed)
        snaps = find_snapshots(run / "snapshots")
        return trajectory(subject, snaps, config.n_contexts, config.seed, config.min_phase, subject.device, progress=False,
                          positions=positions)




def summary(r: dict) -> str:
    over = common.positions_words(r.get("positions", "all"), r.get("trained_on", "all"))
    lines = [f"{r['family']} model, {len(r['snapshots'])} snapshots, {r['n_contexts']} contexts; NLL and KL {over}"]
    lines.append("strategies' NLL: " + ", ".join(f"{s} {v:.4f}" for s, v in r["strategies"].items()))
    lines.append(f"{'step':>7s}{'NLL':>9s}{'progress':>9s}{'purity':>8s}{'demos':>6s}{'sel TV':>8s}  closest")
    for row, c in zip(r["snapshots"], r["closest"]):
        lines.append(
            f"{row['step']:7d}{row['nll']:9.4f}{row['progress']:9.3f}{row['copyer_purity']:8.3f}"
            f"{row['distinct_demonstrations']:6d}{row['selector_tv']:8.3f}  {c}"
        )
    lines.append("phases: " + " -> ".join(f"{p['strategy']} [{p['start']}, {p['end']}]" for p in r["phases"]))
    for s in r["switches"]:
        lines.append(
            f"switch {s['from']} -> {s['to']} at step {s['step']} (KL curves cross at {s['crossing']:.0f}); "
            f"loss {s['loss_before']:.4f} -> {s['loss_after']:.4f}, "
            f"{'sharp' if s['sharp'] else 'not sharp'} ({s['sharpness']:.1f}x the median rate)"
        )
    return "\n".join(lines)


def _phase_background(ax, r: dict, colors: dict) -> None:
    """Shade each phase in its strategy's colour, from switch to switch (the KL curves' crossings), and
    draw each switch (dashed)."""
    edges = [r["snapshots"][0]["step"], *(s["crossing"] for s in r["switches"]), r["snapshots"][-1]["step"]]
    for p, a, b in zip(r["phases"], edges, edges[1:]):
        ax.axvspan(a, b, color=colors[p["strategy"]], alpha=0.12, lw=0)
    for s in r["switches"]:
        ax.axvline(s["crossing"], color="k", ls="--", lw=0.8)


def _per_head(ax, steps: list[int], rows: list[dict], styles: dict[str, str]) -> None:
    """One line per head and score (``styles``: score -> line style), coloured by layer."""
    for i, layer in enumerate(rows[0]["layers"]):
        for j in range(len(layer["purity"])):
            for k, (score, ls) in enumerate(styles.items()):
                kw = {"label": f"layer {i}"} if j == 0 and k == 0 else {}
                ax.plot(steps, [row["layers"][i][score][j] for row in rows], ls, color=f"C{i}", lw=1, **kw)
    ax.set(ylim=(0, 1.05))
    ax.legend(fontsize=8)


def figures(result: common.Result) -> dict:
    r = result.data
    import matplotlib.pyplot as plt

    steps = [row["step"] for row in r["snapshots"]]
    colors = {s: f"C{i}" for i, s in enumerate(r["strategies"])}
    where = f"{r['family']} model, {r['n_contexts']} contexts per snapshot"
    fig, axes = plt.subplots(2, 1, figsize=(6.4, 6.0), sharex=True, layout="constrained")
    ax = axes[0]
    ax.plot(steps, [row["nll"] for row in r["snapshots"]], "k.-", label="model")
    for s, v in r["strategies"].items():
        ax.axhline(v, color=colors[s], ls=":", label=s)
    _phase_background(ax, r, colors)
    ax.set(ylabel="target NLL (nats)", title=f"Loss over training ({where})")
    ax.legend(fontsize=8)
    ax = axes[1]
    for s in r["strategies"]:
        ax.plot(
            steps, [max(row["kl"][s], 1e-6) for row in r["snapshots"]], ".-", color=colors[s], label=f"KL({s} || model)"
        )
    _phase_background(ax, r, colors)
    order = " -> ".join(r["order"])
    ax.set(
        yscale="log", xlabel="training step", ylabel="KL (nats)", title=f"Distance from each strategy; phases: {order}"
    )
    ax.legend(fontsize=8)
    out = {"trajectory_loss": fig}

    fig, axes = plt.subplots(3, 2, figsize=(10, 9.2), sharex=True, layout="constrained")
    rows = r["snapshots"]
    ax = axes[0, 0]
    ax.plot(steps, [row["progress"] for row in rows], "k.-")
    ax.axhline(0, color="C3", ls=":", label=f"{r['plateau']} plateau")
    ax.axhline(1, color="C0", ls=":", label="Bayes")
    ax.set(ylabel="progress", title="Progress from the plateau (0) to Bayes (1)")
    ax.legend(fontsize=8)
    ax = axes[0, 1]
    n_heads = len(rows[0]["layers"][0]["purity"])
    ax.plot(steps, [row["copyer_purity"] for row in rows], "C2.-", label="mean purity (mass on one demonstration)")
    ax.plot(steps, [row["distinct_demonstrations"] / n_heads for row in rows], "C4.-",
            label=f"distinct demonstrations / {n_heads} heads")  # fmt: skip
    ax.set(ylim=(0, 1.05), title="Layer 0: copying")
    ax.legend(fontsize=8)
    if not r["n_examples"]:
        ax.text(0.5, 0.5, "no demonstrations (L = 0)", transform=ax.transAxes, ha="center", va="center")
    ax = axes[1, 0]
    ax.plot(steps, [row["selector_tv"] for row in rows], "C1.-", label="TV to BMA posterior")
    ax.plot(steps, [row["selector_parent_acc"] for row in rows], "C0.-", label="parent accuracy")
    ax.axhline(r["acc_bma"], color="C0", ls=":", label="BMA's accuracy")
    ax.axhline(r["acc_uniform"], color="C3", ls=":", label="uniform's accuracy")
    ax.set(ylim=(0, 1.05), title="Parent selection (the head closest to BMA)")
    ax.legend(fontsize=8)
    ax = axes[1, 1]
    _per_head(ax, steps, rows, {"within_sequence": "-", "cross_demonstration": "--"})
    ax.set_title("Per head, from target queries: within-sequence (solid)\nand cross-demonstration (dashed) mass")
    _per_head(axes[2, 0], steps, rows, {"previous_token": "-", "own_parent": ":"})
    axes[2, 0].set_title("Per head: mass on the previous token (solid)\nand on the current token's parent (dotted)")
    _per_head(axes[2, 1], steps, rows, {"induction": "-", "induction_chance": ":"})
    axes[2, 1].set_title(
        "Per head: mass on the tokens after earlier occurrences\nof the current one (induction; dotted: chance)"
    )
    for ax in axes[2]:
        ax.set_xlabel("training step")
    for ax in axes.flat:
        _phase_background(ax, r, colors)
    fig.suptitle(f"Circuit parts over training ({where})")
    out["trajectory_circuit"] = fig
    return out


ANALYSIS = common.register(globals())
