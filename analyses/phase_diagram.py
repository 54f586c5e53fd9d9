"""Where a standard transformer learns the task and where it does not: a phase diagram.

    python -m analyses.phase_diagram                 # the paper run: re-plot the committed full sweep (seconds)
    python -m analyses.phase_diagram --quick         # train a small grid now (9 cells, a fast check)
    python -m analyses.phase_diagram --full --jobs 2 # train all 44 cells and the boundary cells' extra seeds
    python -m analyses.phase_diagram --full --cluster slurm:PARTITION --jobs 44   # the same on a Slurm cluster

Training goes through ``models.training.sweep`` (every run a job: ``--cluster``, ``--jobs``; the numbers do not
depend on either). The full sweep takes too long for the paper run, so its JSON is committed
(``figures/phase_diagram_sweep.json``, the ``phase_diagram.json`` that ``--full`` wrote, verbatim) and the
paper run re-plots it (``--sweep`` re-plots another one), as ``analyses.scale`` re-plots committed histories.

Three families train from scratch on fresh contexts, side by side: ``gpt2`` (the ``models.standard``
recipe: a pre-norm GPT-2 with MLPs), ``attn_only`` (the same GPT-2 with its MLPs and LayerNorms removed,
``models.standard`` ``arch='attn_only'``) and ``disentangled`` (the paper's model, ``models.train``;
it predicts the target tokens only, so it has no all-token loss). The sweep varies the kernel's
sharpness (rows ``(1 - gamma) Dirichlet(alpha) + gamma / d``), the number of demonstrations L and the
standard models' loss (every next token, or the target tokens only). Every run is evaluated every
``eval_every`` steps on held-out contexts (BMA and the uniform-parent plateau on the same contexts):

    progress = (NLL_plateau - NLL) / (NLL_plateau - NLL_BMA)        (models.training.standard.progress)

The figure shows the progress after the step budget (colour) and the first evaluated step with
progress >= 0.5 (in each cell; '-' if never). Cells near the boundary (seed-0 progress within
``boundary`` of 0.5) are rerun with more seeds; the cell shows their mean and the JSON every seed.
"""

from __future__ import annotations

import os

from analyses import common
from models.training import sweep

NAME = "phase_diagram"
SWEEP = common.FIGURES_DIR / "phase_diagram_sweep.json"  # what `--full --out DIR` wrote as DIR/phase_diagram.json
FAMILIES = ("gpt2", "attn_only", "disentangled")


REQUIRES = None  # its own synthetic tasks: no --checkpoint


class Config(sweep.SweepConfig):
    """What ``run`` computes: every field is also a flag. Without ``quick`` or ``full`` it re-plots ``sweep``
    (default: the committed full sweep)."""

    quick: bool = common.option(False, "train a small grid now (3 kernels, L=6, all-token loss, 600 steps)")
    full: bool = common.option(False, "train the full grid now (44 cells and the boundary cells' seeds)")
    sweep: str | None = common.option(None, f"re-plot this phase_diagram.json of an earlier --full or --quick run "
                                      f"(default without --quick or --full: {os.path.relpath(SWEEP, common.FIGURES_DIR.parent)}, "
                                      "the committed full sweep)", metavar="FILE")  # fmt: skip
    families: tuple[str, ...] | None = common.option(None, "families to train (default: all)", choices=FAMILIES)
    device: str = common.option("cpu", "torch device to train on, e.g. cpu or cuda")

    def validate(self):
        super().validate()
        chosen = [n for n in ("quick", "full", "sweep") if getattr(self, n) not in (False, None)]
        if len(chosen) > 1:
            raise ValueError(f"{chosen[0]} and {chosen[1]} exclude each other: train a grid, or re-plot a sweep")
        given = [n for n, on in (("families", self.families), ("jobs", self.jobs != 1),
                                 ("cluster", self.cluster != "local")) if on]  # fmt: skip
        if not (self.quick or self.full) and given:
            raise ValueError(f"{given[0]} applies to training; add --quick or --full (without them the committed "
                             "sweep is re-plotted)")  # fmt: skip

    def reads(self) -> list[str]:
        """The sweep it re-plots (no output may be it)."""
        return [] if self.quick or self.full else [str(self.sweep or SWEEP)]

common.parse_first(globals())  # python -m: --help and a mistyped flag answer here, before torch is imported

import dataclasses
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from models.plumbing.io import UsageError, read_json
from models.training.standard import StandardConfig, progress, reference_nlls, train_standard
from models.training.train import TrainConfig, train

PAPER_ARGS = []  # analyses.paper re-plots the committed full sweep (its 54 runs take far longer than the paper run)
FIGURES = {
    "phase_diagram.png": (
        "progress from the uniform-parent plateau (0) to BMA (1) after a fixed step budget in one heatmap: a row per family (GPT-2, attention-only LayerNorm-free GPT-2, disentangled) and L and loss, a column per kernel (sharper to the right, with the plateau's gap to BMA); each cell prints the progress, the seeds averaged and the first step with progress >= 0.5; re-plotted from the committed full sweep, phase_diagram_sweep.json"
    ),
    "phase_diagram_curves.png": "progress against training step for every run of the sweep, one panel per family and kernel",
}


@dataclass
class Grid:
    """The sweep. ``kernels``: (alpha, gamma) pairs, flattest first; ``rows``: (L, loss) pairs of the
    standard families (the disentangled model gets one row per L, its own target-token loss)."""

    kernels: list[tuple[float, float]] = field(
        default_factory=lambda: [(1.0, 0.2), (0.6, 0.1), (0.3, 0.05), (0.1, 0.02)]
    )
    rows: list[tuple[int, str]] = field(default_factory=lambda: [(6, "all"), (6, "target"), (3, "all"), (12, "all")])
    families: list[str] = field(default_factory=lambda: list(FAMILIES))
    steps: int = 1200  # the step budget of a standard model
    disentangled_steps: int = 300  # the disentangled model leaves the plateau within a few hundred
    eval_every: int = 100
    eval_contexts: int = 512
    seq_len: int = 6
    d_vocab: int = 5
    task_seed: int = StandardConfig.task_seed  # draws pi for each (alpha, gamma)
    # The standard models of the sweep: the models.standard recipe at a quarter of its compute per step
    # (width 32, 4 heads, batch 64, lr 3e-3 after a 100-step warm-up), so that the grid fits the budget.
    d_model: int = 32
    n_heads: int = 4
    d_mlp: int = 128
    batch_size: int = 64
    lr: float = 3e-3
    warmup: int = 100
    boundary: float = 0.3  # seed-0 progress within this of 0.5: rerun with the extra seeds
    extra_seeds: int = 2
    max_boundary_cells: int = 4  # per family

    def __post_init__(self):
        for name in ("steps", "disentangled_steps", "eval_every", "eval_contexts", "seq_len", "d_vocab"):
            if getattr(self, name) < 1:
                raise UsageError(f"{name} must be >= 1, got {getattr(self, name)}")
        bad = [f for f in self.families if f not in FAMILIES]
        if bad or not self.families:
            raise UsageError(f"families must be among {', '.join(FAMILIES)}; got {self.families}")
        bad = [r for r in self.rows if len(r) != 2 or r[1] not in ("all", "target") or int(r[0]) < 1]
        if bad or not self.rows or not self.kernels:
            raise UsageError(f"rows must be (L >= 1, 'all' or 'target') pairs and kernels non-empty; got {self.rows}")
        self.kernels = [tuple(k) for k in self.kernels]
        self.rows = [(int(L), loss) for L, loss in self.rows]


QUICK = Grid(  # one extra seed on at most one boundary cell per family; three kernels, one row, shorter runs
    extra_seeds=1,
    max_boundary_cells=1,
    kernels=[(1.0, 0.2), (0.3, 0.05), (0.1, 0.02)],
    rows=[(6, "all")],
    steps=600,
    disentangled_steps=200,
    eval_every=100,
    eval_contexts=256,
)


def train_cell(
    family: str, alpha: float, gamma: float, L: int, loss_on: str, seed: int, grid: Grid, device: str = "cpu"
) -> dict:
    """One training run (a job of the sweep); its evaluation history as (step, NLL, progress), the plateau's
    gap to BMA and its own wall time in seconds."""
    start = time.perf_counter()
    # The fields both trainers share: the task, the seed, the evaluation and the device.
    shared = dict(d_vocab=grid.d_vocab, n_examples=L, seq_len=grid.seq_len, alpha=alpha, gamma=gamma)
    shared.update(task_seed=grid.task_seed, seed=seed, eval_every=grid.eval_every, eval_contexts=grid.eval_contexts)
    shared.update(device=device)
    if family == "disentangled":
        with tempfile.TemporaryDirectory() as tmp:
            cfg = TrainConfig(**shared, steps=grid.disentangled_steps, out=str(Path(tmp) / "run"))
            _, history = train(cfg, progress=False)
        # models.train draws its held-out contexts from seed + 1_000_003, as models.standard does
        tokens, _ = cfg.task().sample(cfg.eval_contexts, torch.Generator().manual_seed(seed + 1_000_003))
        ref = reference_nlls(cfg.task(), tokens)
        if abs(ref["nll_bma"] - history[-1]["nll_bma"]) > 1e-9:
            raise RuntimeError("the disentangled run's held-out contexts are not the ones evaluated here")
        history = [{**m, "progress": progress(m["nll"], ref["nll_uniform"], ref["nll_bma"])} for m in history]
    else:
        sizes = dict(n_heads=grid.n_heads, d_model=grid.d_model, d_mlp=grid.d_mlp, batch_size=grid.batch_size)
        cfg = StandardConfig(
            **shared, **sizes, arch=family, lr=grid.lr, warmup=grid.warmup, loss_on=loss_on, steps=grid.steps
        )
        _, history = train_standard(cfg, progress=False, save=False)
        ref = history[-1]
    return {
        "steps": [m["step"] for m in history],
        "nll": [m["nll"] for m in history],
        "progress": [m["progress"] for m in history],
        "nll_bma": ref["nll_bma"],
        "nll_uniform": ref["nll_uniform"],
        "plateau_gap": ref["nll_uniform"] - ref["nll_bma"],
        "seconds": time.perf_counter() - start,
    }


def steps_to(run: dict, level: float = 0.5) -> int | None:
    """The first evaluated step with progress >= level (None: never within the budget)."""
    return next((s for s, p in zip(run["steps"], run["progress"]) if p >= level), None)


def cells_of(grid: Grid) -> list[dict]:
    """Every (family, kernel, L, loss) of the grid; the disentangled model once per kernel and L. Ordered
    by L (as it first appears in ``grid.rows``), then kernel, then family: a partial sweep covers them all."""
    first_row = {}  # L -> the first row of grid.rows with it
    for i, (L, _) in enumerate(grid.rows):
        first_row.setdefault(L, i)
    cells = [
        {"family": family, "alpha": alpha, "gamma": gamma, "L": L, "loss_on": loss_on}
        for family in grid.families
        for L, loss_on in _rows(grid, family)
        for alpha, gamma in grid.kernels
    ]
    return sorted(
        cells,  # stable: within a family, the rows keep their order
        key=lambda c: (
            first_row[c["L"]],
            grid.kernels.index((c["alpha"], c["gamma"])),
            grid.families.index(c["family"]),
        ),
    )


def train_grid(grid: Grid, seed: int = 0, device: str = "cpu", log=print, cluster: str = "local", jobs: int = 1) -> dict:
    """Train every cell with ``seed``, then the boundary cells with the extra seeds ``seed + 1, ...``, every
    run a job of ``models.training.sweep.run_jobs`` on ``cluster``, ``jobs`` at a time; plain data (``runs[0]`` of
    every cell is the ``seed`` run)."""
    start, load = time.perf_counter(), os.getloadavg()[0]
    cells = cells_of(grid)

    def train_all(keys: list[dict], seeds: list[int], what: str) -> list[dict]:
        finished = []

        def done(i, run):
            finished.append(i)
            log(f"  {what} {len(finished)}/{len(keys)}: {_describe({**keys[i], 'runs': {seeds[i]: run}})} "
                f"({time.perf_counter() - start:.0f} s)")  # fmt: skip

        kwargs = [{**key, "seed": s, "grid": grid, "device": device} for key, s in zip(keys, seeds)]
        return sweep.run_jobs(train_cell, kwargs, cluster, jobs, on_done=done)

    for cell, run in zip(cells, train_all([_key(c) for c in cells], [seed] * len(cells), "cell")):
        cell["runs"] = {seed: run}
    boundary = []  # (cell, extra seed) of the cells whose seed-0 progress is near 0.5
    for family in grid.families:
        near = [
            c for c in cells if c["family"] == family and abs(c["runs"][seed]["progress"][-1] - 0.5) <= grid.boundary
        ]
        near.sort(key=lambda c: abs(c["runs"][seed]["progress"][-1] - 0.5))
        boundary += [
            (c, extra)
            for c in near[: grid.max_boundary_cells]
            for extra in range(seed + 1, seed + grid.extra_seeds + 1)
        ]
    runs = train_all([_key(c) for c, _ in boundary], [s for _, s in boundary], "boundary")
    for (cell, extra), run in zip(boundary, runs):
        cell["runs"][extra] = run
    for cell in cells:
        final = [r["progress"][-1] for r in cell["runs"].values()]
        cell.update(
            seeds=sorted(cell["runs"]),
            final_progress=final,
            mean_progress=float(np.mean(final)),
            steps_to_half=[steps_to(r) for r in cell["runs"].values()],
            plateau_gap=cell["runs"][seed]["plateau_gap"],
        )
        cell["runs"] = [{"seed": s, **r} for s, r in cell["runs"].items()]
    return {
        "grid": dataclasses.asdict(grid),
        "seed": seed,
        "cells": cells,
        "seconds": time.perf_counter() - start,  # wall time of the whole sweep
        "engine": {"cluster": cluster, "jobs": jobs, "load_average": [load, os.getloadavg()[0]]},
    }


def _key(cell: dict) -> dict:
    return {k: cell[k] for k in ("family", "alpha", "gamma", "L", "loss_on")}


def _describe(cell: dict) -> str:
    runs = list(cell["runs"].values())
    final = ", ".join(f"{r['progress'][-1]:.2f}" for r in runs)
    half = ", ".join(str(steps_to(r)) for r in runs)
    return (
        f"{cell['family']:12s} alpha={cell['alpha']:<4g} gamma={cell['gamma']:<4g} L={cell['L']:<2d} "
        f"loss={cell['loss_on']:6s} plateau gap {runs[0]['plateau_gap']:.3f}: progress {final}; "
        f"step to 0.5: {half}"
    )


def _rows(grid: Grid, family: str) -> list[tuple[int, str]]:
    if family != "disentangled":
        return grid.rows
    return [(L, "target") for L in sorted({L for L, _ in grid.rows})]


FAMILY_NAMES = {
    "gpt2": "GPT-2",
    "attn_only": "attention-only GPT-2\n(no MLP, no LayerNorm)",
    "disentangled": "disentangled",
}


def plot(res: dict):
    """One heatmap: a row per (family, L, loss), a column per kernel (flattest left); each cell the progress
    after the family's step budget, with the first step at progress >= 0.5 per seed."""
    import matplotlib.pyplot as plt  # heavy; only when plotting
    from matplotlib.colors import TwoSlopeNorm

    grid = Grid(**res["grid"])
    cells = {(c["family"], c["alpha"], c["gamma"], c["L"], c["loss_on"]): c for c in res["cells"]}
    rows = [(family, L, loss) for family in grid.families for L, loss in _rows(grid, family)]
    values = np.array([[cells[(f, a, g, L, loss)]["mean_progress"] for a, g in grid.kernels] for f, L, loss in rows])
    fig, ax = plt.subplots(figsize=(2.3 * len(grid.kernels) + 4.5, 0.95 * len(rows) + 2.4), layout="constrained")
    norm = TwoSlopeNorm(vmin=-0.2, vcenter=0.5, vmax=1.0)
    im = ax.imshow(values, cmap="RdYlGn", norm=norm, aspect="auto")
    ax.grid(False)
    for i, (family, L, loss) in enumerate(rows):
        for j, (alpha, gamma) in enumerate(grid.kernels):
            c = cells[(family, alpha, gamma, L, loss)]
            half = " / ".join("-" if s is None else str(s) for s in c["steps_to_half"])
            half = ": never" if all(s is None for s in c["steps_to_half"]) else f" at step {half}"
            shade = norm(c["mean_progress"])  # white text on the dark ends of the colour map, black between
            colour = "w" if shade < 0.2 or shade > 0.85 else "k"
            ax.text(j, i, f"{c['mean_progress']:.2f}", ha="center", va="center", fontsize=15, fontweight="bold",
                    color=colour)  # fmt: skip
            ax.text(j, i + 0.3, f"progress 0.5{half}", ha="center", va="center", fontsize=9, color=colour)
            if len(c["seeds"]) > 1:
                ax.text(j, i - 0.3, f"mean of {len(c['seeds'])} seeds", ha="center", va="center", fontsize=9,
                        color=colour)  # fmt: skip
    for i in range(1, len(rows)):
        if rows[i][0] != rows[i - 1][0]:
            ax.axhline(i - 0.5, color="k", lw=2)
    gaps = {(a, g): max(cells[(f, a, g, L, loss)]["plateau_gap"] for f, L, loss in rows if L == rows[0][1])
            for a, g in grid.kernels}  # fmt: skip
    ax.set_xticks(
        range(len(grid.kernels)),
        [f"(1-{g:g}) Dir({a:g}) + {g:g}/d\nplateau {gaps[(a, g)]:.2f} nats above BMA" for a, g in grid.kernels],
        fontsize=10,
    )
    budget = {f: grid.disentangled_steps if f == "disentangled" else grid.steps for f in grid.families}
    ax.set_yticks(
        range(len(rows)),
        [f"{FAMILY_NAMES.get(f, f)}\nL={L}, loss on {'all tokens' if loss == 'all' else 'targets'}, {budget[f]} steps"
         for f, L, loss in rows],
        fontsize=10,
    )  # fmt: skip
    ax.set_xlabel("kernel rows: sharper to the right (the demonstrations are worth more)", fontsize=11)
    fig.colorbar(im, ax=ax, shrink=0.8, label="progress after the budget (0: plateau, 1: BMA)")
    ax.set_title(
        f"Where a transformer leaves the uniform-parent plateau (d={grid.d_vocab}, H={grid.seq_len})",
        fontsize=12,
    )
    return fig


def plot_curves(res: dict):
    import matplotlib.pyplot as plt  # heavy; only when plotting

    grid = Grid(**res["grid"])
    kernels = grid.kernels
    n_examples = sorted({L for L, _ in grid.rows})
    fig, axes = plt.subplots(
        len(grid.families),
        len(kernels),
        figsize=(2.8 * len(kernels), 2.3 * len(grid.families) + 0.8),
        squeeze=False,
        sharey=True,
        layout="constrained",
    )
    styles = {loss: ls for loss, ls in zip(("all", "target"), ("-", "--"))}
    for i, family in enumerate(grid.families):
        for j, (alpha, gamma) in enumerate(kernels):
            ax = axes[i, j]
            for c in res["cells"]:
                if (c["family"], c["alpha"], c["gamma"]) != (family, alpha, gamma):
                    continue
                colour = f"C{n_examples.index(c['L'])}"
                for r in c["runs"]:
                    label = f"L={c['L']}, {c['loss_on']}" if r["seed"] == res["seed"] else None
                    ax.plot(
                        r["steps"],
                        r["progress"],
                        styles[c["loss_on"]],
                        color=colour,
                        lw=1,
                        alpha=1 if r["seed"] == res["seed"] else 0.5,
                        label=label,
                    )
            ax.axhline(0.5, color="grey", lw=0.5)
            # Linear over [-1, 1] (plateau 0, BMA 1), logarithmic beyond: a run far below the plateau
            # (progress -12 early in training) is drawn whole instead of clipped.
            ax.set_yscale("symlog", linthresh=1)
            ax.set_yticks([-10, -1, 0, 0.5, 1], ["-10", "-1", "0", "0.5", "1"])
            ax.set_title(f"{family}: Dir({alpha:g}), {gamma:g}/d", fontsize=9)
            if i == len(grid.families) - 1:
                ax.set_xlabel("step", fontsize=9)
            if j == 0:
                ax.set_ylabel("progress (0: plateau, 1: BMA)", fontsize=9)
    handles = {}
    for ax in axes.flat:
        handles.update(zip(*reversed(ax.get_legend_handles_labels())))
    order = sorted(handles, key=lambda label: (int(label.split(",")[0][2:]), label))
    fig.legend([handles[k] for k in order], [k.replace(", all", ", loss on all tokens").replace(", target", ", loss on targets") for k in order],
               fontsize=9, loc="outside lower center", ncol=min(len(order), 4), frameon=False)  # fmt: skip
    fig.suptitle("progress during training, per family and kernel (faint: other seeds)", fontsize=11)
    return fig


def cell_lines(res: dict) -> list[str]:
    """One line per cell, grouped by family."""
    lines = []
    for c in res["cells"]:
        final = ", ".join(f"{p:.2f}" for p in c["final_progress"])
        half = ", ".join("-" if s is None else str(s) for s in c["steps_to_half"])
        lines.append(
            f"  {c['family']:12s} Dir({c['alpha']:g}) + {c['gamma']:g}/d (gap {c['plateau_gap']:.3f}) L={c['L']:<2d} "
            f"loss {c['loss_on']:6s}: progress {final}; first step >= 0.5: {half}"
        )
    return lines




def read_sweep(path: str | Path) -> dict:
    """The results of an earlier ``--full`` or ``--quick`` run from its ``phase_diagram.json``, with where they
    came from (``sweep``: the file and the command that trained them); one ``ValueError`` if it holds none."""
    record = read_json(path, "--sweep")
    res = record.get("results") if isinstance(record, dict) else None
    keys = ("grid", "seed", "cells", "seconds", "mode")
    if not isinstance(res, dict) or any(k not in res for k in keys) or res["mode"] not in ("full", "quick"):
        raise UsageError(
            f"--sweep {str(path)!r} holds no trained sweep; expected the {NAME}.json of python -m analyses.{NAME} --full"
        )
    plotted = ("seeds", "final_progress", "mean_progress", "steps_to_half", "plateau_gap", "runs")
    try:
        grid = Grid(**res["grid"])
        cells = {tuple(_key(c).values()) for c in res["cells"] if all(k in c for k in plotted)}
    except (TypeError, KeyError, ValueError, AttributeError) as e:
        raise UsageError(f"--sweep {str(path)!r}: its grid or cells are malformed ({type(e).__name__}: {e})") from None
    missing = [c for c in cells_of(grid) if tuple(c.values()) not in cells]
    if missing:
        raise UsageError(
            f"--sweep {str(path)!r} lacks {len(missing)} cells of its grid (with {', '.join(plotted)}), e.g. {missing[0]}"
        )
    where, root = Path(path).resolve(), common.FIGURES_DIR.parent
    shown = str(where.relative_to(root)) if where.is_relative_to(root) else str(where)
    return {**res, "sweep": {"file": shown, "command": record.get("command")}}


def compute(subject, config: Config) -> dict:
    """The grid trained now (``quick`` or ``full``), or an earlier sweep re-plotted."""
    if not (config.quick or config.full):
        return read_sweep(config.sweep or SWEEP)
    grid = dataclasses.replace(QUICK if config.quick else Grid(), **({"families": config.families} if config.families else {}))
    mode = "quick" if config.quick else "full"
    print(f"{NAME}: {len(cells_of(grid))} cells ({mode} grid) on --cluster {config.cluster}, --jobs {config.jobs}")
    return {**train_grid(grid, config.seed, config.device, cluster=config.cluster, jobs=config.jobs), "mode": mode}


def describe_run(res: dict) -> str:
    """The summary's first line: the grid, how long training took, and where a re-plot read it."""
    trained = f"{res['mode']} grid, seed {res['seed']}, trained in {res['seconds']:.0f} s wall"
    engine = res.get("engine")
    if engine:
        trained += f" (--cluster {engine['cluster']} --jobs {engine['jobs']}, load {engine['load_average'][0]:.1f})"
    if "sweep" in res:
        return f"{NAME} ({trained}; re-plotted from {res['sweep']['file']}, written by: {res['sweep']['command']}):"
    return f"{NAME} ({trained}):"


def figures(result: common.Result) -> dict:
    return {NAME: plot(result.data), f"{NAME}_curves": plot_curves(result.data)}


def summary(res: dict) -> str:
    return describe_run(res) + "\n" + "\n".join(cell_lines(res))


ANALYSIS = common.register(globals())
