"""What every analysis shares: its config, its ``run``, its result, and the command line made from them.

An analysis is one call from Python::

    from analyses import logpi_recovery
    result = logpi_recovery.run(models.load_subject("default"), logpi_recovery.Config(n_contexts=512))
    result.summary(); result.figures(); result.to_dict(); result.save("runs/x")

An analysis module defines ``NAME``, ``REQUIRES`` (the capabilities of ``models.interp.capabilities`` it needs
of its subject, or None for an analysis of its own synthetic tasks), a frozen ``Config(common.Config)`` whose
fields are declared with ``option`` (each a flag, with its default and help; checked by type and range when
the config is made, ``Config.validate`` for rules between fields), ``compute(subject, config) -> data`` (plain
data), ``figures(result) -> {stem: figure}`` (``result.data``, ``result.config``, ``result.title``) and
``summary(data) -> str``, ``FIGURES`` (each file, for the gallery), and ends with
``ANALYSIS = common.register(globals())``, which defines the module's ``run(subject, config)`` and ``main(argv)``
(optional names: ``record``, what the JSON keeps of the data; ``WHY_NOT``, a family's reason added to its
refusal). Being a module of ``analyses/`` is its registration (``analysis_names``). ``common.parse_first(
globals())`` comes after the config and before the heavy imports: run as ``python -m``, it parses the flags
there, so that ``--help`` and a mistyped flag answer before torch is imported. The command line:

    python -m analyses.<name> [--checkpoint default] [--out DIR] [--device cpu] [--threads N]
                              [--key-map MAP.json] [--config CONFIG.json] [--<config field> VALUE ...]

A Python call raises ``TypeError`` or ``ValueError`` (``UsageError`` is one) for bad input, never
``SystemExit``; ``main`` turns those into one line and exit code 2. Importing this module imports no torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import hashlib
import importlib
import json
import os
import pkgutil
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields
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
from models.plumbing.config import MAX_SEED, Config, field_kind, flag_of, n_contexts, option  # noqa: F401 (the analyses' names)
from models.plumbing.io import UsageError, read_json, to_json, write_json, write_set
from models.plumbing.progress import progress as progress_bar
from models.plumbing.words import positions_words, title_name  # noqa: F401 (the analyses' names)

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
HOOKS = ("NAME", "REQUIRES", "Config", "compute", "figures", "summary", "record", "pages", "WHY_NOT", "CHECKPOINT")
OTHER_NAMES = ("FIGURES", "PAPER_ARGS", "QUICK_CONFIG", "ANALYSIS", "run", "main")  # QUICK_CONFIG: a test's sizes  # read by analyses.paper and the tests


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


# Configs (models.plumbing.config) as flags --------------------------------------------------------------
def add_config_flags(p: argparse.ArgumentParser, config: type[Config]) -> None:
    """A flag for every field of ``config``, with its help, default and choices (a bool: ``--x``/``--no-x``)."""
    for f in fields(config):
        kind, optional, many = field_kind(f)
        meta = f.metadata
        flag = flag_of(f)
        shown = ",".join(map(str, f.default)) if many and f.default is not None else f.default
        text = meta["help"] if f.default is None else f"{meta['help']} (default: {shown})"
        if kind is bool:
            p.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=f.default, help=text)
            continue
        convert = cli.finite_float if kind is float else kind
        metavar = meta.get("metavar") or (flag[2:].upper().replace("-", "_") if meta.get("flag") else None)
        kw = {"type": convert, "choices": meta.get("choices"), "metavar": metavar}
        if many and meta.get("sep"):
            kw = {"type": lambda s, c=convert, sep=meta["sep"]: split_flag(s, c, sep), "metavar": metavar}
        elif many:
            kw["nargs"] = "+"
        p.add_argument(flag, dest=f.name, default=f.default, help=text, **kw)


def split_flag(text: str, convert, sep: str) -> tuple:
    """A tuple flag's value: ``"1,4,16"`` -> ``(1, 4, 16)``; ``""`` or ``none`` -> ``()``."""
    if text.strip().lower() in ("", "none"):
        return ()
    try:
        return tuple(convert(v) for v in text.split(sep))
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"expected values separated by {sep!r} (or none), got {text!r}") from None


def config_from_args(p: argparse.ArgumentParser, config: type[Config], args: argparse.Namespace) -> Config:
    """``config`` made from the flags ``add_config_flags`` added; a bad value is ``p.error`` naming its flag."""
    try:
        return config(**{f.name: getattr(args, f.name) for f in fields(config)})
    except (TypeError, ValueError) as e:
        p.error(cli.as_flags(str(e), config))


# Results ----------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Result:
    """What ``run`` returns: the data an analysis computed, with the config and subject that made it.

    Attributes:
        analysis: the ``Analysis`` that made it.
        config: its config.
        data: the computed numbers (plain data: dicts, lists, tensors).
        subject: the subject's name (its ``--checkpoint``), or None for an analysis of its own tasks.
        subject_hash: a digest of the subject's weights, or None.
        command: the command line that makes the same result (its `--threads` the count it ran on: float sums
            depend on it).
    """

    analysis: Analysis
    config: Config
    data: object
    subject: str | None = None
    subject_hash: str | None = None
    command: str = ""

    @property
    def name(self) -> str:
        return self.analysis.name

    @property
    def title(self) -> str:
        """The subject's name as figure titles show it (``title_name``)."""
        return title_name(self.subject) if self.subject is not None else "synthetic tasks"

    def to_dict(self) -> dict:
        """What the analysis's JSON holds: every plotted number with the command, seed and checkpoint hash that
        reproduce it (tensors as lists)."""
        record = {
            "command": self.command,
            "seed": self.config.seed,
            "n_contexts": getattr(self.config, "n_contexts", None),
            "checkpoint": self.subject,
            "checkpoint_hash": self.subject_hash,
            "results": self.analysis.record(self.data),
        }
        return json.loads(json.dumps(record, default=to_json))

    def summary(self) -> str:
        """The text ``python -m analyses.<name>`` prints."""
        return self.analysis.summary(self.data)

    def figures(self) -> dict:
        """``{file stem: matplotlib Figure}``: the figures the command line writes (as PNG and PDF), by stem.
        Close them with ``plt.close(fig)`` when done."""
        if self.analysis.figures is None:
            return {}
        style()
        figs = self.analysis.figures(self)
        return figs if isinstance(figs, dict) else {self.name: figs}

    def pages(self) -> dict[str, str]:
        """``{file name: text}``: what the analysis writes beside its figures (an HTML page), if anything."""
        return {} if self.analysis.pages is None else self.analysis.pages(self)

    def save(self, out: str | Path) -> list[Path]:
        """Write the figures (PNG + PDF) and ``<name>.json`` into the folder ``out`` as one set
        (``models.plumbing.io.write_set``): after an error or a kill it holds all the new files or all the old."""
        import matplotlib.pyplot as plt

        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        figs = self.figures()
        writers = {f"{stem}.{ext}": (lambda p, f=fig: render_figure(f, p)) for stem, fig in figs.items()
                   for ext in ("png", "pdf")}  # fmt: skip
        writers.update({file: (lambda p, t=text: p.write_text(t, encoding="utf-8")) for file, text in self.pages().items()})
        writers[f"{self.name}.json"] = lambda p: write_json(p, self.to_dict())
        try:
            return write_set(out, self.name, writers)
        finally:
            for fig in figs.values():
                plt.close(fig)

    def __repr__(self) -> str:
        return f"<analyses.{self.name} result: {self.command}>"


# Analyses ---------------------------------------------------------------------------------------------
@dataclass
class Analysis:
    """One analysis: what is particular to it. ``run`` computes it, ``main`` is its command line."""

    name: str
    doc: str  # the module docstring: its first paragraph is the --help description
    config: type[Config]
    compute: Callable | None  # (subject | None, config) -> data
    figures: Callable | None  # (result) -> {file stem: figure}, or one figure (stem: the name)
    summary: Callable | None  # (data) -> str
    requires: frozenset[str] | None = None  # capabilities it needs of its subject (None: no --checkpoint)
    record: Callable = field(default=lambda data: data)  # data -> what the JSON keeps
    why_not: dict[str, str] = field(default_factory=dict)  # family -> why the analysis does not apply to it
    checkpoint: str = "default"  # the default --checkpoint
    pages: Callable | None = None  # (result) -> {file name: text}: files it writes beside (or instead of) figures

    @classmethod
    def from_module(cls, ns: dict) -> Analysis:
        """The analysis a module declares by its names (``HOOKS``; a name within a typo of one is refused)."""
        near = {n: difflib.get_close_matches(n, HOOKS, 1, 0.85) for n in ns if n not in HOOKS + OTHER_NAMES}
        typos = {n: m[0] for n, m in near.items() if m and not n.startswith("_")}
        if typos:
            raise ValueError(f"analyses.{ns.get('NAME')}: unknown names {typos} (did you mean them?); expected {HOOKS}")
        if "REQUIRES" not in ns:
            raise ValueError(f"analyses.{ns.get('NAME')} declares no REQUIRES (its needs, or None: no --checkpoint)")
        optional = {"record": ns.get("record"), "why_not": ns.get("WHY_NOT"), "checkpoint": ns.get("CHECKPOINT"),
                    "pages": ns.get("pages")}  # fmt: skip
        return cls(ns["NAME"], ns["__doc__"], ns["Config"], ns.get("compute"), ns.get("figures"), ns.get("summary"),
                   ns["REQUIRES"], **{k: v for k, v in optional.items() if v is not None})  # fmt: skip

    def run(self, subject: Subject | None = None, config: Config | None = None) -> Result:
        """The analysis of ``subject`` (a ``models.Subject``: ``models.load_subject(path)``; None for an analysis of
        its own tasks) with ``config`` (default: ``Config()``). Raises ``TypeError`` for an argument of the wrong
        kind, ``ValueError`` for a subject that lacks what the analysis needs or sizes that do not fit."""
        import torch

        from models.interp.subject import Subject

        where = f"analyses.{self.name}.run"
        config = self.config() if config is None else config
        if not isinstance(config, self.config):
            raise TypeError(f"{where}: config must be an analyses.{self.name}.Config, got {type(config).__name__}; "
                            f"make one with analyses.{self.name}.Config(...)")  # fmt: skip
        if self.requires is None and subject is not None:
            raise TypeError(f"{where} studies its own synthetic tasks and takes no subject; pass None")
        if self.requires is not None:
            if not isinstance(subject, Subject):
                raise TypeError(f"{where}: subject must be a models.Subject, got {type(subject).__name__}; "
                                "make one with models.load_subject(path)")  # fmt: skip
            check_requirements(self, subject)
            if hasattr(subject.model, "eval"):
                subject.model.eval()
        torch.manual_seed(config.seed)
        data = self.compute(subject, config)
        flags = [] if subject is None else getattr(subject, "load_flags", None) or ["--checkpoint", subject.name]
        flags = [*flags, *config.flags(), "--threads", str(torch.get_num_threads())]  # float sums depend on it
        command = " ".join([f"python -m analyses.{self.name}", *map(shlex.quote, flags)])
        return Result(self, config, data, None if subject is None else subject.name,
                      None if subject is None else subject.hash, command)  # fmt: skip

    def load(self, record: dict | str | Path) -> Result:
        """A result from the JSON a run wrote (``record``, or its path): its figures and summary redrawn from the
        numbers, its config parsed from the command that made them. The data are as JSON keeps them (lists, not
        tensors)."""
        if not isinstance(record, dict):
            record = read_json(record, f"the {self.name} JSON")
        flags = shlex.split(record.get("command") or "")[3:]
        args = parser_for(self).parse_args(flags)
        config = self.config(**{f.name: getattr(args, f.name) for f in fields(self.config)})
        return Result(self, config, record["results"], record.get("checkpoint"), record.get("checkpoint_hash"),
                      record.get("command") or "")  # fmt: skip

    def main(self, argv: list[str] | None = None) -> Result:
        """``python -m analyses.<name> [flags]``, or from Python with ``argv`` (a shell's call: bad input is
        ``SystemExit(2)``); returns the result."""
        return main(self, argv)


def parse_first(ns: dict) -> None:
    """The line of an analysis module between its ``Config`` and its heavy imports. Run as ``python -m
    analyses.<name>``, it checks the environment and parses the flags there, before torch is imported: ``--help``
    prints and exits 0, a mistyped flag or a malformed ``OMP_NUM_THREADS`` is one line and exit 2 (``main``
    parses them again with the module whole). Imported, the module runs nothing here."""
    if ns.get("__name__") != "__main__":
        return
    analysis = Analysis(ns["NAME"], ns["__doc__"], ns["Config"], None, None, None, ns["REQUIRES"],
                        checkpoint=ns.get("CHECKPOINT", "default"))
    cli.run_cli(lambda argv: parse(analysis, argv, check=False), None, f"python -m analyses.{analysis.name}")


class ConfigParser(cli.OneLineParser):
    """A parser whose flags make a config: ``parse_args`` also makes it, so that a value the config refuses (two
    fields that exclude each other) is the parser's own one-line error."""

    config: type[Config] = Config

    def parse_args(self, args=None, namespace=None):
        parsed = super().parse_args(args, namespace)
        config_from_args(self, self.config, parsed)
        return parsed


def parser_for(analysis: Analysis) -> argparse.ArgumentParser:
    """The analysis's command line: the subject's flags (if it has a subject), ``--out``, ``--threads``, and a
    flag per field of its config."""
    p = cli.parser(f"python -m analyses.{analysis.name}", analysis.doc, ConfigParser)
    p.config = analysis.config
    if analysis.requires is not None:
        cli.add_subject_flags(p, analysis.checkpoint)
    p.add_argument(
        "--out",
        default=None,
        help=f"folder for the figures and JSON (default: {RUNS_DIR}/<checkpoint>/, a folder named for the model "
        "analysed; the committed figures/ are written only by python -m analyses.paper)",
    )
    cli.add_threads_flag(p)
    add_config_flags(p, analysis.config)
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


def parse(analysis: Analysis, argv: list[str] | None, check: bool = True) -> tuple[argparse.Namespace, Config]:
    """The flags parsed and checked before any work (``--out`` defaulted by ``default_out``): the namespace of
    the command line's own flags and the analysis's config. ``check=False``: only what needs no torch."""
    p = parser_for(analysis)
    args = p.parse_args(argv)
    config = config_from_args(p, analysis.config, args)
    if args.out is None:
        args.out = str(default_out(getattr(args, "checkpoint", None)))
    if getattr(config, "work_dir", "") is None:  # a config that keeps its work (trained models) keeps it in --out
        config = dataclasses.replace(config, work_dir=args.out)
    if check:
        reads = getattr(config, "reads", lambda: [])()
        cli.check_run_flags(p, args, argv, reads=reads)  # --out's parents made
        written = (Path(args.out) / f"{analysis.name}.json").resolve()
        for path in reads:
            if Path(path).resolve() == written:
                p.error(f"{path} is the file this run writes (it would write over what it reads); choose another "
                        "--out, or copy it elsewhere first")  # fmt: skip
    return p, args, config


def report_written(paths: list[Path]) -> None:
    """The one line that ends a run: where its files went."""
    folder = str(paths[0].parent) if paths else "?"  # --out as given (relpath would turn /tmp/x into ../x)
    print(f"wrote {len(paths)} files to {folder}/: {', '.join(p.name for p in paths)}")


def positions_option(what: str):
    """The ``positions`` field: the target positions ``what`` average(s) over (``probes.metrics.POSITIONS``),
    by default those the model's loss used (``Subject.trained_on``)."""
    return option("trained", f"the target positions {what} average over: trained (those its loss used: the last "
                  "token for a CatFormer or a model trained with --loss-on last, else all), all (every h >= 1) or last",
                  choices=("trained", "all", "last"))  # fmt: skip


def check_out(p: argparse.ArgumentParser, out: str) -> None:
    """``--out`` must be a writable folder (or creatable inside an existing one): checked before any work."""
    with cli.flag_errors(p):
        cli.check_out_folder(out)


def main(analysis: Analysis, argv: list[str] | None = None) -> Result:
    """The command line: parse the flags into a config, load the subject, ``run``, save the figures and JSON as
    one set, print the summary; returns the result. Off a terminal, a line every 30 s says which stage runs
    (``models.plumbing.progress``)."""
    p, args, config = parse(analysis, argv)
    with progress_bar(desc=f"analyses.{analysis.name}", leave=False) as stages:
        subject = None
        if analysis.requires is not None:
            stages.set_postfix(stage="load")
            subject = cli.subject_or_exit(p, args, getattr(config, "n_contexts", None))
            with cli.flag_errors(p):  # a subject the analysis cannot study: one line, exit 2
                check_requirements(analysis, subject)
        stages.set_postfix(stage="compute")
        try:
            result = analysis.run(subject, config)
        except UsageError as e:  # bad input found in the work (a node the model lacks): one line, its flag named
            if getattr(args, "debug", False):
                raise
            p.error(cli.as_flags(str(e), analysis.config))
        stages.set_postfix(stage="save")
        written = result.save(args.out)
    print(result.summary())
    report_written(written)
    return result


def register(ns: dict) -> Analysis:
    """The one registration line at the foot of an analysis module, ``ANALYSIS = common.register(globals())``:
    its ``Analysis`` (``Analysis.from_module``), the module's ``run(subject, config)`` and ``main(argv)``, and
    the run under ``python -m analyses.<name>``."""
    analysis = Analysis.from_module(ns)
    ns["run"], ns["main"] = analysis.run, analysis.main
    if ns["__name__"] == "__main__":
        run_cli(analysis.main)
    return analysis


def run_cli(main_fn, argv: list[str] | None = None):
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
def render_figure(fig, path: Path) -> None:
    """Write one figure to ``path`` (format from the suffix); no creation date, so the same numbers give
    the same bytes."""
    ext = path.suffix[1:]
    kw = {"dpi": 150} if ext == "png" else {"metadata": {"CreationDate": None}}
    fig.savefig(path, format=ext, bbox_inches="tight", **kw)


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
    """``with single_thread():`` run torch on one intra-op thread, then restore the previous count: numbers
    as ``--threads 1`` gives them (the committed figures' count; ``python -m analyses.paper`` runs each job so)."""

    def __enter__(self):
        import torch

        self.previous = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        import torch

        torch.set_num_threads(self.previous)
