"""What every analysis shares: one ``main`` for parsing, loading the subject, seeding, computing, saving
PNG + PDF + JSON as one set, printing a summary, and errors.

An analysis module defines ``NAME``, ``compute``, ``figures`` and ``summary``, declares ``REQUIRES``, and ends
with one line, ``ANALYSIS = common.register(globals())`` (optional names: ``N_CONTEXTS``, ``add_flags``,
``check_flags``, ``record``, ``WHY_NOT``: a family's reason, added to its refusal); being a module of ``analyses/`` is its registration (``analysis_names``). What its
command line needs (``NAME``, ``REQUIRES``, ``N_CONTEXTS``, ``add_flags``) comes first, then
``common.parse_first(globals())``, then the heavy imports: run as ``python -m``, it parses its flags there, so that
``--help`` and a mistyped flag answer before torch is imported:
``compute(subject, args) -> result`` (plain data; ``subject`` is a ``models.Subject``, or None for an
analysis of its own synthetic tasks), ``figures(result, args) -> {stem: matplotlib figure}`` (or one
figure, filed under ``NAME``), and ``summary(result) -> str``; ``FIGURES`` describes each file for the gallery. ``main`` does the rest:

    python -m analyses.<name> [--checkpoint default] [--out figures/] [--seed 0] [--n-contexts N]
                              [--device cpu] [--threads 1] [--key-map MAP.json] [--config CONFIG.json]

What an analysis needs of its subject beyond the common interface is its module's ``REQUIRES`` (capabilities
of ``models.interp.capabilities``); a subject that lacks one is refused with one line naming the need and the
analyses that do apply to it (exit code 2). Importing this module imports no torch.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import importlib
import os
import pkgutil
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from models import cli
from models.interp.capabilities import (  # noqa: F401 (analyses declare REQUIRES with them)
    BAYES_TASK,
    BILINEAR,
    CONTENT_FREE_COPYERS,
    DISENTANGLED,
    MARKOV_TASK,
)
from models.loading.named import NAMED
from models.plumbing.io import UsageError, write_json, write_set
from models.plumbing.progress import progress as progress_bar

if TYPE_CHECKING:
    from models.interp.subject import Subject

FIGURES_DIR = Path(__file__).resolve().parent.parent / "figures"  # the paper's figures: analyses.paper only
RUNS_DIR = Path("runs") / "figures"  # every other run's, relative to the working folder

# The analyses in the order of the paper's argument (mechanism, theory, other models, scale, CAPE): the paper run's
# and the gallery's order. Not a registration: a module of analyses/ is an analysis (``analysis_names``); one
# missing here comes after these, by name.
ORDER = [
    "head_ablation", "activation_patching", "copyers", "logpi_recovery", "block_structure", "bma_agreement",
    "init_gradient", "information", "continuous", "inspect", "inspect_standard", "linear_probes", "standard_circuit", "circuit",
    "standard_vs_disentangled", "trajectory", "phase_diagram", "nichani_dags", "attention_view", "scale", "cape_structure", "cape_properties",
    "cape_downstream",
]  # fmt: skip
NOT_ANALYSES = ("common", "paper")  # the shared main and the paper run
# The names Analysis.from_module reads; a module-level name within a typo of one (add_flag) is refused.
HOOKS = ("NAME", "REQUIRES", "compute", "figures", "summary", "N_CONTEXTS", "add_flags", "check_flags", "record",
         "WHY_NOT")
OTHER_NAMES = ("FIGURES", "PAPER_ARGS", "QUICK_ARGS", "ANALYSIS")  # read by analyses.paper and the tests


def analysis_names() -> list[str]:
    """Every analysis: each module of ``analyses/`` but ``NOT_ANALYSES``, in ``ORDER``, then any other by name
    (found by listing the folder: nothing is imported)."""
    found = {m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)])} - set(NOT_ANALYSES)
    return [n for n in ORDER if n in found] + sorted(found - set(ORDER))


def registry() -> dict[str, Analysis]:
    """Every analysis of ``analysis_names``, in order (its module imported on first use)."""
    return {name: importlib.import_module(f"analyses.{name}").ANALYSIS for name in analysis_names()}


def applicable(subject: Subject) -> list[str]:
    """The analyses whose needs ``subject`` meets."""
    return [n for n, a in registry().items() if a.requires is not None and a.requires <= subject.capabilities]


def check_requirements(analysis: Analysis, subject: Subject) -> None:
    """One-line ``UsageError`` if ``subject`` lacks what ``analysis`` needs."""
    missing = sorted((analysis.requires or frozenset()) - subject.capabilities)
    if missing:
        others = ", ".join(applicable(subject)) or "none"
        why = analysis.why_not.get(subject.family)
        raise UsageError(
            f"analyses.{analysis.name} needs a model with {' and '.join(missing)}; --checkpoint {subject.name} is a "
            f"{subject.describe()}{f' ({why})' if why else ''}. Analyses that apply to it: {others}"
        )


@dataclass
class Analysis:
    """One analysis: what is particular to it. ``main(analysis, argv)`` runs it."""

    name: str
    doc: str  # the module docstring: its first paragraph is the --help description
    compute: Callable  # (subject | None, args) -> result
    figures: Callable  # (result, args) -> {file stem: figure}, or one figure (stem: the name)
    summary: Callable  # (result) -> str
    n_contexts: int | None = 2048  # default --n-contexts (None: no such flag)
    requires: frozenset[str] | None = None  # capabilities it needs of its subject (None: no --checkpoint)
    add_flags: Callable | None = None  # (parser) -> None: flags of its own
    check_flags: Callable | None = None  # (parser, args) -> None: validate them (parser.error, or a ValueError)
    record: Callable = field(default=lambda result: result)  # result -> what the JSON keeps
    why_not: dict[str, str] = field(default_factory=dict)  # family -> why the analysis does not apply to it

    @classmethod
    def from_module(cls, ns: dict) -> Analysis:
        """The analysis a module declares by its names: ``NAME``, ``__doc__``, ``compute``, ``figures``,
        ``summary``, ``REQUIRES``, and optionally ``N_CONTEXTS``, ``add_flags``, ``check_flags``, ``record``."""
        near = {n: difflib.get_close_matches(n, HOOKS, 1, 0.85) for n in ns if n not in HOOKS + OTHER_NAMES}
        typos = {n: m[0] for n, m in near.items() if m and not n.startswith("_")}
        if typos:
            raise ValueError(f"analyses.{ns.get('NAME')}: unknown names {typos} (did you mean them?); expected {HOOKS}")
        if "REQUIRES" not in ns:
            raise ValueError(f"analyses.{ns.get('NAME')} declares no REQUIRES (its needs, or None: no --checkpoint)")
        return cls(ns["NAME"], ns["__doc__"], ns["compute"], ns["figures"], ns["summary"], **optional_hooks(ns))

    def main(self, argv: list[str] | None = None) -> dict:
        """``python -m analyses.<name> [flags]``, or from Python with ``argv``; returns the result."""
        return main(self, argv)


def optional_hooks(ns: dict) -> dict:
    """The ``Analysis`` fields a module's optional names give (``N_CONTEXTS`` -> ``n_contexts``, ...)."""
    optional = {
        "requires": "REQUIRES",
        "n_contexts": "N_CONTEXTS",
        "add_flags": "add_flags",
        "check_flags": "check_flags",
        "record": "record",
        "why_not": "WHY_NOT",
    }
    return {key: ns[name] for key, name in optional.items() if name in ns}


def parse_first(ns: dict) -> None:
    """The line of an analysis module between what its command line needs (``NAME``, its docstring,
    ``REQUIRES``, and ``N_CONTEXTS`` and ``add_flags`` if it has them) and its heavy imports. Run as ``python -m
    analyses.<name>``, it checks the environment and parses the flags there, before torch is imported: ``--help``
    prints and exits 0, a mistyped flag or a malformed ``OMP_NUM_THREADS`` is one line and exit 2 (``main``
    parses them again with the module whole). Imported, the module runs nothing here."""
    if ns.get("__name__") != "__main__":
        return
    analysis = Analysis(ns["NAME"], ns["__doc__"], compute=None, figures=None, summary=None, **optional_hooks(ns))
    cli.run_cli(lambda argv: parser_for(analysis).parse_args(argv), None, f"python -m analyses.{analysis.name}")


def parser_for(analysis: Analysis) -> argparse.ArgumentParser:
    p = cli.parser(f"python -m analyses.{analysis.name}", analysis.doc)
    if analysis.requires is not None:
        cli.add_subject_flags(p)
    p.add_argument(
        "--out",
        default=None,
        help=f"folder for the figures and JSON (default: {RUNS_DIR}/<checkpoint>/, a folder named for the model "
        "analysed; the committed figures/ are written only by python -m analyses.paper)",
    )
    cli.add_run_flags(p, n_contexts=analysis.n_contexts)
    if analysis.requires is None:
        p.add_argument("--device", default="cpu", help="torch device to run on, e.g. cpu or cuda (default: cpu)")
    if analysis.add_flags is not None:
        analysis.add_flags(p)
    return p


def default_out(checkpoint: str | None) -> Path:
    """Where an analysis writes unless told: ``runs/figures/<name>/``, named for the model analysed (a named
    checkpoint or ``theorem1:...`` spec as written; a path by its name and a digest of its absolute path;
    ``synthetic`` for an analysis of its own tasks), so that no run replaces the committed figures."""
    def slug(name: str) -> str:
        return re.sub(r"[^A-Za-z0-9._=+-]+", "_", name)

    if checkpoint is None:
        return RUNS_DIR / "synthetic"
    if checkpoint in NAMED or checkpoint.startswith("theorem1"):
        return RUNS_DIR / slug(checkpoint)
    path = Path(checkpoint).expanduser().resolve()
    digest = hashlib.sha1(os.fsencode(path)).hexdigest()[:8]
    return RUNS_DIR / f"{slug(path.name) or 'checkpoint'}-{digest}"


def parse(analysis: Analysis, argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The analysis's flags parsed and checked (``--out`` defaulted by ``default_out``), before any work."""
    p = parser_for(analysis)
    args = p.parse_args(argv)
    if args.out is None:
        args.out = str(default_out(getattr(args, "checkpoint", None)))
    cli.check_run_flags(p, args, argv)  # --out included (its missing parent folders are made)
    if analysis.check_flags is not None:
        with cli.flag_errors(p):  # a ValueError it raises is the same one-line error as its p.error
            analysis.check_flags(p, args)
    return p, args


def title_name(name: str | None) -> str:
    """A model's name as a figure's title shows it: a path by its last part (a user's path would fill the line),
    its bytes that are not UTF-8 escaped (``ck\\xff``: matplotlib draws text, not bytes). Every analysis's title
    reads it as ``args.subject_name``."""
    name = str(name or "model").rstrip("/")
    short = name.rsplit("/", 1)[-1] or name
    return os.fsencode(short).decode("utf-8", "backslashreplace")


def report_written(paths: list[Path]) -> None:
    """The one line that ends a run: where its files went."""
    folder = str(paths[0].parent) if paths else "?"  # --out as given (relpath would turn /tmp/x into ../x)
    print(f"wrote {len(paths)} files to {folder}/: {', '.join(p.name for p in paths)}")


def add_positions_flag(p: argparse.ArgumentParser, what: str) -> None:
    """``--positions``: the target positions ``what`` average(s) over (``probes.metrics.POSITIONS``), by default
    those the model's loss used (``Subject.trained_on``)."""
    p.add_argument(
        "--positions", choices=("trained", "all", "last"), default="trained",  # probes.metrics.POSITIONS, spelled out: it loads torch
        help=f"the target positions {what} average over: trained (those its loss used: the last token for a CatFormer "
        "or a model trained with --loss-on last, else all), all (every h >= 1) or last (default: trained)",
    )  # fmt: skip


def positions(args: argparse.Namespace, subject: Subject) -> str:
    """What ``--positions`` names for ``subject``: its trained positions unless another was chosen."""
    return subject.scored_positions(getattr(args, "positions", None))


def positions_words(chosen: str, trained_on: str) -> str:
    """``over the last token (the positions it was trained on)``: for a summary."""
    which = "the last token" if chosen == "last" else "every target position h >= 1"
    trained = "the last token" if trained_on == "last" else "every position"
    why = "the positions it was trained on" if chosen == trained_on else f"chosen with --positions; trained on {trained}"
    return f"over {which} ({why})"


def check_out(p: argparse.ArgumentParser, out: str) -> None:
    """``--out`` must be a writable folder (or creatable inside an existing one): checked before any work."""
    with cli.flag_errors(p):
        cli.check_out_folder(out)


def check_at_least(p: argparse.ArgumentParser, args: argparse.Namespace, **minimums: int) -> None:
    """``p.error`` for the first of ``args``' integer flags below its minimum, e.g. ``n_trees=1``:
    ``--n-trees must be >= 1, got 0``."""
    for name, low in minimums.items():
        value = getattr(args, name)
        if value < low:
            p.error(f"--{name.replace('_', '-')} must be >= {low}, got {value}")


def check_at_most(p: argparse.ArgumentParser, args: argparse.Namespace, **maximums: int) -> None:
    """``p.error`` for the first of ``args``' integer flags above its maximum (work that no memory check
    bounds, e.g. interpolation steps): ``--ig-steps must be <= 1024, got 10**9``."""
    for name, high in maximums.items():
        value = getattr(args, name)
        if value > high:
            p.error(f"--{name.replace('_', '-')} must be <= {high}, got {value}")


def main(analysis: Analysis, argv: list[str] | None = None) -> dict:
    """Parse, load, compute, save the figures and JSON as one set, print the summary; returns the result.
    Off a terminal, a line every 30 s says which stage runs (``models.plumbing.progress``)."""
    import torch

    p, args = parse(analysis, argv)
    with progress_bar(desc=f"analyses.{analysis.name}", leave=False) as run:
        subject = None
        if analysis.requires is not None:
            run.set_postfix(stage="load")
            subject = cli.subject_or_exit(p, args)
            with cli.flag_errors(p):
                check_requirements(analysis, subject)
            if hasattr(subject.model, "eval"):
                subject.model.eval()
        args.subject_name = None if subject is None else title_name(subject.name)  # for titles; the JSON has subject.name
        torch.manual_seed(args.seed)
        run.set_postfix(stage="compute")
        result = analysis.compute(subject, args)
        run.set_postfix(stage="figures")
        style()
        figs = analysis.figures(result, args)
        if not isinstance(figs, dict):
            figs = {analysis.name: figs}
        run.set_postfix(stage="save")
        written = save_set(args.out, analysis.name, figs, analysis.record(result), args, subject)
    print(analysis.summary(result))
    report_written(written)
    return result


def register(ns: dict, analysis: Analysis | None = None) -> Analysis:
    """The one registration line at the foot of an analysis module, ``ANALYSIS = common.register(globals())``:
    its ``Analysis`` (``analysis``, else ``Analysis.from_module(ns)``), its ``main`` (``ns["main"]``, for
    ``analyses.<name>.main(argv)``), and the run under ``python -m analyses.<name>``."""
    analysis = analysis or Analysis.from_module(ns)
    ns["main"] = analysis.main
    if ns["__name__"] == "__main__":
        run(analysis.main)
    return analysis


def run(main_fn, argv: list[str] | None = None):
    """``python -m analyses.<name>``: bad input is one line and exit code 2, a bug its traceback and exit code 1
    (``models.plumbing.io.run_cli``), each begun with the entry point as the user typed it."""
    analysis = getattr(main_fn, "__self__", None)  # Analysis.main, bound; else a module's own main
    name = f"analyses.{analysis.name}" if isinstance(analysis, Analysis) else module_of(main_fn)
    return cli.run_cli(main_fn, argv, f"python -m {name}")


def module_of(fn) -> str:
    """The dotted name of ``fn``'s module, also when it runs as ``__main__`` (``python -m analyses.NAME``:
    its spec keeps the name the user typed)."""
    if fn.__module__ != "__main__":
        return fn.__module__
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec.name if spec is not None else "__main__"


# Saving -----------------------------------------------------------------------------------------------
def json_record(args: argparse.Namespace, subject: Subject | None, results) -> dict:
    """Every plotted number with the command line, seed and checkpoint hash that reproduce it."""
    return {
        "command": getattr(args, "command", None),
        "seed": args.seed,
        "n_contexts": getattr(args, "n_contexts", None),
        "checkpoint": None if subject is None else subject.name,
        "checkpoint_hash": None if subject is None else subject.hash,
        "results": results,
    }


def render_figure(fig, path: Path) -> None:
    """Write one figure to ``path`` (format from the suffix); no creation date, so the same numbers give
    the same bytes."""
    ext = path.suffix[1:]
    kw = {"dpi": 150} if ext == "png" else {"metadata": {"CreationDate": None}}
    fig.savefig(path, format=ext, bbox_inches="tight", **kw)


def save_set(out: str | Path, name: str, figures: dict, results, args, subject: Subject | None) -> list[Path]:
    """Write every figure (PNG + PDF) and ``name.json`` as one set (``models.plumbing.io.write_set``): after an
    error, a kill or a concurrent run, ``out`` holds all of this run's files or all of the old ones."""
    import matplotlib.pyplot as plt  # plotting stays off the import path of the CLIs' --help

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    writers = {
        f"{stem}.{ext}": (lambda p, f=fig: render_figure(f, p))
        for stem, fig in figures.items()
        for ext in ("png", "pdf")
    }
    writers[f"{name}.json"] = lambda p: write_json(p, json_record(args, subject, results))
    try:
        return write_set(out, name, writers)
    finally:
        for fig in figures.values():
            plt.close(fig)


def sample_contexts(task, n: int, seed: int):
    """``n`` fresh contexts from the task, a function of ``seed`` only."""
    import torch

    return task.sample(n, torch.Generator().manual_seed(seed))


def style():
    """The suite's matplotlib style (call once before plotting)."""
    import matplotlib  # plotting stays off the import path of the CLIs' --help

    matplotlib.use("Agg")
    import seaborn as sns

    sns.set_theme(context="paper", style="whitegrid", font_scale=1.1)


class single_thread:
    """``with single_thread():`` run torch on one intra-op thread, then restore the previous count: for
    calling an analysis's ``compute`` from Python (its CLI sets ``--threads``, default 1, itself)."""

    def __enter__(self):
        import torch

        self.previous = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        import torch

        torch.set_num_threads(self.previous)
