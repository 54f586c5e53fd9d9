"""Training at scale: the NLL gap to BMA, TV to the BMA posterior and copyer-head purity over steps,
old recipe against new, at d=10, L=K=32, H=24, and the large preset at d=20, L=K=64, H=32.

    python -m analyses.scale                                       # the figure, from figures/scale_histories.json
    python -m analyses.scale --from-runs "old recipe=runs/old" "new recipe=runs/new"   # collect, then plot
    python -m analyses.scale --from-runs "large preset=runs/large"  # add (or replace) one run, keep the rest

Retraining takes tens of minutes on 2 cores, so the figure reads the evaluation histories that
``models.train`` saved in each checkpoint (``config.json``), collected once into a small JSON file
(``--histories``, default ``figures/scale_histories.json``, beside the figure). It takes no --checkpoint.
"""

from __future__ import annotations

from pathlib import Path

from analyses import common
from models import cli
from models.plumbing.io import UsageError, what_is

NAME = "scale"
REQUIRES = None  # its own synthetic tasks: no --checkpoint (it reads training histories)
HISTORIES = common.FIGURES_DIR / "scale_histories.json"





class Config(common.Config):
    """What ``run`` computes: every field is also a flag."""

    from_runs: tuple[str, ...] | None = common.option(None, f"collect these checkpoints' histories into "
                                                      f"{HISTORIES.name} first (added to the runs already there)",
                                                      metavar="LABEL=FOLDER")  # fmt: skip
    histories: str | None = common.option(None, "the collected histories (JSON; default: the committed "
                                          f"figures/{HISTORIES.name})")  # fmt: skip

    def histories_file(self) -> str:
        """``histories``, or the committed file (a default that names no machine's path)."""
        return self.histories or str(HISTORIES)

    def reads(self) -> list[str]:
        """The run folders it collects (no output may lie in one)."""
        return [folder for _, folder in run_pairs(self.from_runs)] if self.from_runs else []

common.parse_first(globals())  # python -m: --help and a mistyped flag answer here, before torch is imported

from models.loading.checkpoint import read_config
from models.plumbing.io import exclusive_lock, read_json, write_json

FIGURES = {
    "scale.png": "NLL gap to BMA, TV to the BMA posterior and the least pure copyer head over training "
    "steps at d=10, L=K=32, H=24 (the reference recipe of docs/paper.md section 5, the float32 scale recipe, "
    "`--preset medium` in bfloat16) and at d=20, L=K=64, H=32 (the float32 run of 3000 steps, "
    "`--preset large` in bfloat16, the first 300 steps at full copyer rate)"
}
KEPT = ("step", "seconds", "loss", "nll_gap", "tv_to_bma", "parent_acc", "parent_acc_bma", "distinct_demos")


def collect(runs: dict[str, str | Path]) -> dict:
    """``{label: checkpoint folder}`` -> ``{label: {"config", "history"}}`` with the per-head lists
    reduced to the least pure head (commit-sized). One line naming the run if one has no usable history."""
    out = {}
    for label, folder in runs.items():
        training = read_config(folder)["training"]
        where = f"--from-runs {label}={folder}"
        if not isinstance(training, dict) or not isinstance(training.get("history"), list):
            raise UsageError(f"{where}: its config.json has no training history; expected a models.train run")
        try:
            history = [
                {**{k: m.get(k) for k in KEPT}, "min_purity": min(m["head_purity"]), "n_heads": len(m["head_purity"])}
                for m in training["history"]
            ]
        except (TypeError, KeyError, ValueError, AttributeError):
            raise UsageError(f"{where}: an evaluation of its history has no head_purity list") from None
        out[label] = check_run(where, {"config": training.get("config"), "history": history})
    return out


def check_run(where: str, run_: dict) -> dict:
    """``run_`` (``{"config", "history"}``) if ``curves`` can plot it: a config with the task sizes and at
    least one evaluation with every plotted number; else one ``ValueError`` naming ``where``."""
    run_ = run_ if isinstance(run_, dict) else {}
    cfg, history = run_.get("config"), run_.get("history")
    sizes = ("d_vocab", "n_examples", "seq_len", "batch_size", "eval_contexts")
    if not isinstance(cfg, dict) or any(k not in cfg for k in sizes):
        raise UsageError(f"{where}: no training config with {', '.join(sizes)}")
    if not isinstance(history, list) or not history:
        raise UsageError(f"{where}: its history is empty; expected at least one evaluation")
    needed = ("step", "nll_gap", "tv_to_bma", "min_purity", "distinct_demos", "n_heads")
    for m in history:
        absent = [k for k in needed if not isinstance(m, dict) or not isinstance(m.get(k), (int, float))]
        if absent:
            raise UsageError(f"{where}: an evaluation of its history has no number for {', '.join(absent)}")
    return run_


def curves(histories: dict) -> dict:
    """The plotted numbers: per run, steps and the three curves, plus the run's size and last point."""
    result = {}
    for label, run_ in histories.items():
        h = run_["history"]
        cfg = run_["config"]
        result[label] = {
            "size": f"d={cfg['d_vocab']} L=K={cfg['n_examples']} H={cfg['seq_len']}, batch {cfg['batch_size']}",
            "eval_contexts": cfg["eval_contexts"],
            "step": [m["step"] for m in h],
            "nll_gap": [m["nll_gap"] for m in h],
            "tv_to_bma": [m["tv_to_bma"] for m in h],
            "min_purity": [m["min_purity"] for m in h],
            "final": h[-1],
        }
    return result


def figures(r: common.Result):
    result = r.data
    import matplotlib.pyplot as plt  # plotting stays off the import path of the CLI's --help

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for label, c in result.items():
        for ax, key in zip(axes, ("nll_gap", "tv_to_bma", "min_purity")):
            ax.plot(c["step"], c[key], marker=".", label=f"{label} ({c['size']}; {c['eval_contexts']} eval contexts)")
    axes[0].set_yscale("log")
    axes[0].axhline(0.01, color="k", ls=":", lw=1)
    axes[1].axhline(0.05, color="k", ls=":", lw=1)
    axes[2].set_ylim(0, 1.02)
    for ax, title in zip(
        axes,
        (
            "NLL gap to BMA (nats; target 0.01)",
            "mean TV to BMA posterior (target 0.05)",
            "least pure copyer head (mass on its demo)",
        ),
    ):
        ax.set_title(title)
        ax.set_xlabel("training step")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=2, bbox_to_anchor=(0.5, 0.0), frameon=False)
    fig.suptitle("Training at scale: held-out evaluation during training, old recipe against new")
    return fig


def run_pairs(items: list[str]) -> list[tuple[str, str]]:
    """``["LABEL=FOLDER", ...]`` -> ``[(label, folder), ...]``. Labels and folders may both hold "=": an item
    splits at the one "=" whose right side is an existing folder (``"alpha 0.1=runs/alpha=0.1"``), else at
    the last; two such splits are ambiguous (one line)."""
    pairs = []
    for item in items:
        splits = [(item[:i], item[i + 1 :]) for i, c in enumerate(item) if c == "=" and i > 0]
        if not splits:
            raise UsageError(f"--from-runs expects LABEL=FOLDER items, got {item!r}")
        folders = [(label, folder) for label, folder in splits if Path(folder).is_dir()]
        if len(folders) > 1:
            raise UsageError(
                f"--from-runs {item!r} is ambiguous: {' and '.join(repr(f) for _, f in folders)} are both folders; "
                "rename one (LABEL=FOLDER)"
            )
        pairs.append(folders[0] if folders else splits[-1])
    return pairs


def check_files(config: Config) -> None:
    """``from_runs`` well formed and ``histories`` an output under the rules of ``--out`` (a file in a writable
    folder, none of the runs read); without runs to collect, an existing file."""
    if config.from_runs:
        cli.check_out_file(config.histories_file(), "histories")
        target = Path(config.histories_file()).expanduser().resolve()
        for folder in config.reads():
            source = Path(folder).expanduser().resolve()
            if target == source or source in target.parents:
                raise UsageError(f"histories {config.histories_file()!r} would write into {str(source)!r}, which this "
                                 "command reads; pick another path")  # fmt: skip
    elif not Path(config.histories_file()).is_file():
        raise UsageError(f"histories {config.histories_file()!r} {what_is(config.histories_file())}; collect it with --from-runs "
                         "LABEL=FOLDER ...")  # fmt: skip


def compute(subject, config: Config) -> dict:
    """Collect ``--from-runs`` into ``--histories`` (merged into the runs already there: earlier runs'
    folders need not exist any more), then the curves of every run in it. Every run is checked first:
    ``--histories`` is rewritten only once all of them can be plotted. The read, the merge and the write
    hold a lock on ``--histories``: two collections at once take turns, and neither loses the other's runs."""
    check_files(config)
    path = Path(config.histories_file())
    if not config.from_runs:
        return curves(read_histories(path))
    with exclusive_lock(path.parent / f".{path.name}.lock", what=f"--histories {config.histories_file()!r}"):
        histories = read_histories(path) if path.is_file() else {}
        histories.update(collect(dict(run_pairs(config.from_runs))))
        result = curves(histories)
        write_json(path, histories)
    return result


def read_histories(path: Path) -> dict:
    """The collected histories at ``path``, every run checked (one line naming the file and the run)."""
    histories = read_json(path, "--histories")
    if not isinstance(histories, dict) or not histories:
        raise UsageError(f"--histories {str(path)!r} holds no runs; expected {{label: {{config, history}}}}")
    for label, run_ in histories.items():
        check_run(f"--histories {str(path)!r}, run {label!r}", run_)
    return histories


def summary(result: dict) -> str:
    lines = []
    for label, c in result.items():
        f = c["final"]
        lines.append(
            f"{label:>28} ({c['size']}): step {f['step']}, gap {f['nll_gap']:+.4f}, TV {f['tv_to_bma']:.3f}, "
            f"min purity {f['min_purity']:.3f}, {f['distinct_demos']}/{f['n_heads']} distinct demos"
        )
    return "\n".join(lines)




ANALYSIS = common.register(globals())
