"""One command-line convention for every entry point: the same flag names, defaults and checks.

``--checkpoint`` (a named checkpoint, a path in any loadable format, or ``theorem1:beta=B``), ``--key-map``
and ``--config`` (for weight files), ``--device``, ``--dtype``, ``--seed`` (default 0), ``--n-contexts``,
``--threads`` (default: torch's, the cores available; float sums depend on the thread count), ``--out``. Bad values are a
``UsageError``: one line, exit 2 (``Parser.error`` for argparse's own, ``run_cli`` for the rest); any other
exception is a bug, shown as one (``models.plumbing.io.run_cli``).

The room of ``models`` above ``interp``: it loads subjects for the entry points (``subject_or_exit``). Building
a parser and parsing flags import neither torch nor a model: ``python -m ENTRY --help`` and a mistyped flag
answer before any heavy import (the checks that need torch import it when they run).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import re
import sys
import tempfile
from pathlib import Path

from models.loading.named import NAMED, THEOREM1, THEOREM1_USAGE
from models.nets.dtypes import RUN_DTYPES
from models.plumbing.config import MAX_CONTEXTS, flag_of
from models.plumbing.io import (
    UsageError,
    exclusive_lock,
    is_utf8,
    name_too_long,
    one_line,
    read_json,
    run_cli,
    what_is,
    write_json,
)

__all__ = [
    "run_cli",
    "parser",
    "add_subject_flags",
    "add_run_flags",
    "add_threads_flag",
    "check_run_flags",
    "check_out_folder",
    "check_out_file",
    "check_own_output",
    "add_json_flags",
    "subject_or_exit",
    "UsageError",
]

PATH_FLAGS = ("checkpoint", "config", "key_map")  # flags naming files to read (unless a named checkpoint)


def finite_float(text: str) -> float:
    """The ``type`` of every float flag: a number that is finite (``nan``, ``inf``, ``1e999`` refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


class OneLineParser(argparse.ArgumentParser):
    """argparse, except that an error is one line on stderr (``prog: error: message``; ``--help`` shows
    the usage) and exit code 2, and that every float flag is ``finite_float``."""

    def add_argument(self, *args, **kwargs):
        if kwargs.get("type") is float:
            kwargs["type"] = finite_float
        return super().add_argument(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {one_line(' '.join(str(message).split()))}\n")


def parser(prog: str, doc: str | None, cls: type[OneLineParser] = OneLineParser) -> argparse.ArgumentParser:
    """A ``OneLineParser`` (or subclass ``cls``) whose description is the first paragraph of ``doc``; ``--debug`` is
    documented."""
    p = cls(prog=prog, description=(doc or "").strip().split("\n\n")[0])
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")
    return p


FLAG_HELP = {  # --help of the config fields that models.train and models.standard share (``flag`` without a help)
    "d_vocab": "vocabulary size d of the task",
    "n_examples": "number of demonstrations L in each context",
    "seq_len": "length H of each sequence (demonstrations and target)",
    "alpha": "Dirichlet concentration of the kernel's rows (drawn once, or per context for kernel=dirichlet): smaller is sharper",
    "steps": "number of optimisation steps, each on a fresh batch of contexts",
    "batch_size": "contexts per step",
    "device": "torch device to train on, e.g. cpu or cuda",
    "eval_contexts": "held-out contexts for each evaluation",
}


MAX_ALPHA = 1e6  # Dirichlet(alpha) kernel rows: uniform to ~1e-3 at 1e6; beyond, the draw overflows (1e308: NaN rows)

def dataclass_float(text: str) -> float:
    """The ``type`` of a dataclass's float flag: its ``__post_init__`` checks the value (finite, in its range)
    and names the range in its message."""
    return float(text)


FLAG_TYPES = {"int": int, "float": dataclass_float, "str": str, "int | None": int}


def flag(default, help: str | None = None):
    """A config field that is a flag: its default and its ``--help`` sentence, declared together
    (``help`` omitted: the field is one both trainers share, explained in ``FLAG_HELP``)."""
    return dataclasses.field(default=default, metadata={"help": help} if help else {})


def flag_helps(cls) -> dict[str, str]:
    """The ``--help`` sentence of every field of the dataclass ``cls`` (its ``flag``'s, else ``FLAG_HELP``'s)."""
    return {f.name: f.metadata.get("help", FLAG_HELP.get(f.name)) for f in dataclasses.fields(cls)}


def add_dataclass_flags(p: argparse.ArgumentParser, cls, choices: dict | None = None) -> None:
    """A ``--field-name`` flag for every field of the dataclass ``cls`` (booleans are switches), explained
    by its ``flag_helps`` sentence with the field's default and, for the fields named in ``choices``, the
    values argparse accepts and lists."""
    helps = flag_helps(cls)
    missing = [name for name, text in helps.items() if text is None]
    if missing:
        raise ValueError(f"{cls.__name__} fields without a --help sentence: {', '.join(missing)}")
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        if f.type == "bool":
            p.add_argument(flag, action="store_true", help=helps[f.name])
            continue
        allowed = (choices or {}).get(f.name)
        p.add_argument(
            flag,
            type=FLAG_TYPES[f.type],
            default=f.default,
            choices=allowed,
            help=f"{helps[f.name]} (default: {f.default})",
        )


def as_flags(message: str, cls) -> str:
    """An error about a field of the dataclass ``cls`` for the command line: a leading field name becomes
    its flag (``lr must be ...`` -> ``--lr must be ...``; a field declared with another flag name, by that:
    ``models.plumbing.config.flag_of``)."""
    flags = {f.name: flag_of(f) for f in dataclasses.fields(cls)}
    return re.sub(r"^ ?(\w+)", lambda m: flags.get(m[1], m[0]), message)


@contextlib.contextmanager
def flag_errors(p: argparse.ArgumentParser, cls=None):
    """Flags checked inside: a ``ValueError`` becomes ``p.error`` (one line, exit 2), its leading field of the
    dataclass ``cls`` named as its flag (``as_flags``)."""
    try:
        yield
    except ValueError as e:
        p.error(str(e) if cls is None else as_flags(str(e), cls))


def dataclass_from_args(cls, args: argparse.Namespace):
    """``cls`` built from the flags ``add_dataclass_flags`` added."""
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


def check_path(path: str, flag: str, utf8: bool = True) -> None:
    """A path flag: no NUL byte, no component over 255 bytes, and (``utf8``: an output) a valid UTF-8
    name (``UsageError`` naming the flag). Inputs may have any name the shell allows (``io.openable``)."""
    if "\x00" in path:
        raise UsageError(f"{flag} {path!r} contains a NUL byte")
    if utf8 and not is_utf8(path):  # bytes undecodable as UTF-8 (surrogate-escaped)
        raise UsageError(f"{flag} {path!r} is not valid UTF-8; expected a UTF-8 name for an output (rename it)")
    long = name_too_long(path)
    if long is not None:
        raise UsageError(f"{flag}: the name {long[:40]!r}... is {len(os.fsencode(long))} bytes; the limit is 255")


def check_out_folder(out: str, flag: str = "--out") -> None:
    """An output folder, checked before any work: not a file, not a dangling symlink, and its nearest
    existing ancestor a writable folder (every entry point makes missing parent folders, as ``mkdir -p``).
    One ``UsageError`` naming ``flag``."""
    check_path(out, flag)
    path = Path(out)
    if path.is_symlink() and not path.exists():
        raise UsageError(f"{flag} {out!r} {what_is(path)}; expected a folder")
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {out!r} {what_is(path)}; expected a folder")
    probe = path if path.exists() else path.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise UsageError(f"{flag} {out!r}: {str(probe)!r} is not a folder")
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        raise UsageError(f"{flag} {out!r} is not writable ({e.strerror or e})") from None


def check_out_file(out: str, flag: str) -> None:
    """An output file, checked before any work: not a folder, in a writable folder (made if missing, with its
    parents, as ``--out``'s)."""
    check_path(out, flag)
    path = Path(out)
    if path.is_dir():
        raise UsageError(f"{flag} {out!r} is a folder; expected a file name")
    if path.is_symlink() and not path.exists() or path.exists() and not path.is_file():
        raise UsageError(f"{flag} {out!r} {what_is(path)}; expected a regular file")
    if path.parent.exists() and not path.parent.is_dir():
        raise UsageError(f"{flag} {out!r}: folder {str(path.parent)!r} {what_is(path.parent)}")
    check_out_folder(str(path.parent), flag=f"{flag} {out!r}: folder")


def add_subject_flags(p: argparse.ArgumentParser, default: str = "default") -> None:
    """``--checkpoint``, ``--key-map``, ``--config``, ``--device``, ``--dtype``."""
    p.add_argument(
        "--checkpoint",
        default=default,
        help=f"'default' (the shipped disentangled model), 'standard' (the shipped GPT-2), a checkpoint folder, "
        f"a weight file, a Hugging Face folder with task.json, or '{THEOREM1_USAGE}' (default: {default})",
    )
    p.add_argument("--key-map", metavar="MAP.json", help="for a weight-file --checkpoint: file key -> our key")
    p.add_argument("--config", metavar="CONFIG.json", help="for a weight-file --checkpoint: its config or task.json")
    p.add_argument(
        "--device", default="cpu", help="torch device to run on, e.g. cpu or cuda (default: cpu)"
    )
    p.add_argument(
        "--dtype", choices=RUN_DTYPES, default=None, help="convert the weights (default: as saved)"
    )


def add_run_flags(p: argparse.ArgumentParser, seed: int = 0, n_contexts: int | None = None) -> None:
    """``--seed``, ``--threads`` and (when ``n_contexts`` is given) ``--n-contexts``."""
    p.add_argument("--seed", type=int, default=seed, help=f"seed of everything random (default: {seed})")
    if n_contexts is not None:
        p.add_argument("--n-contexts", type=int, default=n_contexts, help=f"contexts to sample (default: {n_contexts})")
    add_threads_flag(p)


def add_threads_flag(p: argparse.ArgumentParser) -> None:
    """``--threads``: torch's intra-op CPU threads; by default torch's own count (the cores available), left as
    the caller set it (``analyses.paper`` runs each job on one). The same count and seed give the same numbers;
    float sums may differ in their last digits between counts (the committed figures: ``--threads 1``)."""
    p.add_argument(
        "--threads", type=int, default=None,
        help="torch CPU threads (default: torch's, the cores available; the same count and seed give the same "
             "numbers, another count may move the last digits of a float sum: the committed figures used 1)",
    )  # fmt: skip


def check_run_flags(
    p: argparse.ArgumentParser,
    args: argparse.Namespace,
    argv: list[str] | None = None,
    reads: tuple = (),
) -> None:
    """Validate, before any work, the flags every entry point shares (those it has of ``--seed``,
    ``--n-contexts``, ``--batch-size``, ``--threads``, ``--device``, the path flags, ``--out``,
    ``--json``), apply ``--threads``, and record the command that reproduces the run in ``args.command``.
    ``--out``'s and ``--json``'s missing parent folders will be made (``check_out_folder``). ``reads``: files or folders the
    command reads beyond its flags (no output may be, or lie in, one: ``check_not_an_input``)."""
    import torch

    from models.loading.checkpoint import check_device
    from probes.tasks import MAX_SEED, check_int

    args.reads = [Path(r) for r in reads]
    try:
        for name in ("seed", "task_seed"):
            if getattr(args, name, None) is not None:
                check_int(getattr(args, name), "--" + name.replace("_", "-"), 0, MAX_SEED)
        for name in ("n_contexts", "batch_size"):
            if getattr(args, name, None) is not None:
                check_int(getattr(args, name), "--" + name.replace("_", "-"), 1)
        if getattr(args, "n_contexts", None) is not None and args.n_contexts > MAX_CONTEXTS:  # a batch: memory bounds it
            raise UsageError(
                f"--n-contexts {args.n_contexts} is more than the bound of {MAX_CONTEXTS} contexts "
                "(the work grows with it, however it is chunked); use fewer"
            )
        if getattr(args, "threads", None) is not None:
            check_int(args.threads, "--threads", 1, 1024)
        check_device(getattr(args, "device", "cpu"))
        for name in PATH_FLAGS:
            value = getattr(args, name, None)
            if isinstance(value, str) and value not in NAMED and not value.startswith(THEOREM1):
                check_path(value, "--" + name.replace("_", "-"), utf8=False)
        if isinstance(getattr(args, "out", None), str):
            check_out_folder(args.out)
            check_not_an_input(args.out, args, "--out")
        if isinstance(getattr(args, "json", None), str):
            check_out_file(args.json, "--json")
            check_not_an_input(args.json, args, "--json")
            if not getattr(args, "overwrite", False):
                check_own_output(args.json, "--json", p.prog)
    except ValueError as e:
        p.error(str(e) if not str(e).startswith("device") else f"--{e}")
    if getattr(args, "threads", None) is not None:
        torch.set_num_threads(args.threads)
    given = sys.argv[1:] if argv is None else argv
    args.command = " ".join([p.prog, *(a for a in given if a != "--debug")])


def check_own_output(out: str, flag: str, prog: str) -> None:
    """An existing output file is replaced only if it is this command's own earlier output: a JSON object
    whose ``command`` begins with ``prog`` (what ``check_run_flags`` records). Anything else there is a
    ``UsageError`` (the entry point's ``--overwrite`` replaces it)."""
    path = Path(out)
    if not path.exists():
        return
    try:
        earlier = read_json(path, flag)
    except ValueError:
        earlier = None
    command = earlier.get("command") if isinstance(earlier, dict) else None
    if not (isinstance(command, str) and (command == prog or command.startswith(prog + " "))):
        raise UsageError(
            f"{flag} {out!r} exists and is not an earlier output of {prog}; refusing to replace it "
            "(pass --overwrite to replace it, or pick another name)"
        )


def write_json_output(args: argparse.Namespace, record: dict, prog: str) -> None:
    """Write ``--json``: under a lock on it (two runs take turns), the check that it may be replaced
    (``check_own_output``, unless ``--overwrite``) made again, then the atomic write."""
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)  # a missing folder of --json is made, as --out's (its lock lives there)
    with exclusive_lock(path.parent / f".{path.name}.lock", what=f"--json {args.json!r}"):
        if not getattr(args, "overwrite", False):
            check_own_output(args.json, "--json", prog)
        write_json(path, record)


def add_json_flags(p: argparse.ArgumentParser, what: str) -> None:
    """``--json FILE`` (``what`` it holds) and the ``--overwrite`` that lets it replace a file this command did
    not write (``check_own_output``)."""
    p.add_argument("--json", metavar="FILE", help=f"also write {what} to this JSON file")
    p.add_argument(
        "--overwrite", action="store_true", help="let --json replace an existing file that this command did not write"
    )


def inputs_of(args: argparse.Namespace) -> list[Path]:
    """The files and folders a command reads, resolved: what ``check_run_flags`` was told it ``reads``,
    ``--config``, ``--key-map``, and ``--checkpoint`` with every file it reads (``read_by``)."""
    paths = [Path(r).expanduser().resolve() for r in getattr(args, "reads", ())]
    for name in PATH_FLAGS:
        value = getattr(args, name, None)
        if isinstance(value, str):
            paths += [p.expanduser().resolve() for p in read_by(value)]
    return paths


def read_by(spec: str) -> list[Path]:
    """What ``--checkpoint spec`` reads: a named checkpoint's folder; ``theorem1:...,from=FOLDER``'s folder
    (the shipped one without ``from=``); a folder; a weight file and the side files its config may come
    from (``<stem>.json``, ``config.json`` and ``task.json`` beside it)."""
    from models.loading.sources import theorem1

    if theorem1.detect(spec):
        return [Path(theorem1.parse(spec).get("from", NAMED["default"]))]
    path = Path(NAMED.get(spec, spec))
    if path.is_dir() or not path.suffix:
        return [path]
    return [path, path.with_suffix(".json"), path.parent / "config.json", path.parent / "task.json"]


def check_not_an_input(out: str, args: argparse.Namespace, flag: str) -> None:
    """``UsageError`` if the output ``out`` is, or lies inside, anything the command reads."""
    target = Path(out).expanduser().resolve()
    for source in inputs_of(args):
        if target == source or source in target.parents:
            raise UsageError(f"{flag} {out!r} would write into {str(source)!r}, which this command reads; pick another path")


def subject_or_exit(p: argparse.ArgumentParser, args: argparse.Namespace, n_contexts: int | None = None):
    """The ``models.Subject`` of ``--checkpoint`` with the common flags, checked to fit ``n_contexts`` (default:
    ``--n-contexts``, or ``--batch-size`` if smaller) in memory (``models.interp.memory``); a bad checkpoint is
    ``parser.error`` (exit 2, one line)."""
    from models.interp.memory import check_contexts_fit
    from models.interp.subject import load_subject

    if n_contexts is None and hasattr(args, "n_contexts"):
        n_contexts = min(args.n_contexts, getattr(args, "batch_size", args.n_contexts))
    try:
        subject = load_subject(args.checkpoint, args.device, key_map=args.key_map, config=args.config, dtype=args.dtype)
        if n_contexts is not None:
            check_contexts_fit(subject, n_contexts)
    except ValueError as e:
        if args.debug:
            raise
        p.error(str(e))
    return subject
