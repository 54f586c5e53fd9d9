"""One command-line convention for every entry point: the same flag names, defaults and checks.

``--checkpoint`` (a named checkpoint, a path in any loadable format, or ``theorem1:beta=B``), ``--key-map``
and ``--config`` (for weight files), ``--device``, ``--dtype``, ``--seed`` (default 0), ``--n-contexts``,
``--threads`` (default 1: float reductions depend on the thread count), ``--out``. Bad values exit 2 with
one line (argparse's ``parser.error``); ``run_cli`` turns a ``ValueError`` from deeper down into the same.
"""

from __future__ import annotations

import argparse
import sys

import torch

from models.io import run_cli
from models.subject import THEOREM1_USAGE, Subject, load_subject

__all__ = ["run_cli", "parser", "add_subject_flags", "add_run_flags", "check_run_flags", "subject_or_exit"]

MAX_SEED = 2**63 - 1


class OneLineParser(argparse.ArgumentParser):
    """argparse, except that an error is one line on stderr (``prog: error: message``; ``--help`` shows
    the usage) and exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(str(message).split())}\n")


def parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """A ``OneLineParser`` whose description is the first paragraph of ``doc``; ``--debug`` is documented."""
    p = OneLineParser(prog=prog, description=(doc or "").strip().split("\n\n")[0])
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")
    return p


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
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    p.add_argument("--dtype", choices=["float32", "float64"], default=None, help="convert the weights (default: as saved)")


def add_run_flags(p: argparse.ArgumentParser, seed: int = 0, n_contexts: int | None = None) -> None:
    """``--seed``, ``--threads`` and (when ``n_contexts`` is given) ``--n-contexts``."""
    p.add_argument("--seed", type=int, default=seed, help=f"seed of everything random (default: {seed})")
    if n_contexts is not None:
        p.add_argument("--n-contexts", type=int, default=n_contexts, help=f"contexts to sample (default: {n_contexts})")
    p.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (default: 1, so numbers do not depend on the machine)"
    )


def check_run_flags(p: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str] | None = None) -> None:
    """Validate the flags of ``add_run_flags``/``add_subject_flags``, apply ``--threads``, and record the
    command that reproduces the run in ``args.command``."""
    if not 0 <= args.seed <= MAX_SEED:
        p.error(f"--seed must be between 0 and 2**63 - 1, got {args.seed}")
    if getattr(args, "n_contexts", 1) < 1:
        p.error(f"--n-contexts must be >= 1, got {args.n_contexts}")
    if args.threads < 1:
        p.error(f"--threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    device = getattr(args, "device", "cpu")
    try:
        torch.device(device)
    except RuntimeError:
        p.error(f"--device {device!r} is not a torch device (expected cpu, cuda, cuda:0, ...)")
    if device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {device}: CUDA is not available on this machine")
    given = sys.argv[1:] if argv is None else argv
    args.command = " ".join([p.prog, *(a for a in given if a != "--debug")])


def subject_or_exit(p: argparse.ArgumentParser, args: argparse.Namespace) -> Subject:
    """``load_subject`` with the common flags; a bad checkpoint is ``parser.error`` (exit 2, one line)."""
    try:
        return load_subject(args.checkpoint, args.device, key_map=args.key_map, config=args.config, dtype=args.dtype)
    except ValueError as e:
        if args.debug:
            raise
        p.error(str(e).splitlines()[0] if str(e) else type(e).__name__)
