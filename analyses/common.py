"""What every analysis shares: the flags, loading the subject model, sampling contexts, and writing
figures (PNG + PDF) and the JSON of every plotted number atomically.

Every analysis is ``python -m analyses.<name>`` with the same flags: ``--checkpoint`` (a folder written
by ``models.train``, or ``theorem1:beta=50`` for the Theorem 1 construction on the default task),
``--out`` (default ``figures/``), ``--seed``, ``--n-contexts``, ``--device``, ``--threads`` (default 1).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

FIGURES_DIR = Path(__file__).resolve().parent.parent / "figures"


@dataclass
class Subject:
    """The model an analysis probes, the task it was trained on, and how to cite it."""

    model: object  # models.CausalTransformer
    task: object  # probes.MarkovTreeTask
    name: str  # what --checkpoint said
    hash: str  # content hash of the weights and config (or of the construction)


def analysis_parser(name: str, description: str, n_contexts: int = 2048) -> argparse.ArgumentParser:
    """The flags every analysis takes; add your own after."""
    p = argparse.ArgumentParser(prog=f"python -m analyses.{name}", description=description)
    p.add_argument(
        "--checkpoint",
        default="default",
        help="checkpoint folder, 'default' (the shipped one) or 'theorem1:beta=B' (default: default)",
    )
    p.add_argument("--out", default=str(FIGURES_DIR), help="output folder (default: figures/)")
    p.add_argument("--seed", type=int, default=0, help="seed for the sampled contexts (default: 0)")
    p.add_argument("--n-contexts", type=int, default=n_contexts, help=f"contexts to sample (default: {n_contexts})")
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default: 1, so the numbers do not depend on the machine's core count)",
    )
    p.add_argument(
        "--key-map",
        default=None,
        metavar="MAP.json",
        help="for a .pt/.pth/.bin/.safetensors --checkpoint: file key -> our key (see models.formats)",
    )
    p.add_argument(
        "--config",
        default=None,
        metavar="CONFIG.json",
        help="for a weight-file --checkpoint: a checkpoint config.json or a task.json (models.formats)",
    )
    return p


def parse_common(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse and validate; bad values exit with code 2 and a one-line message (argparse style)."""
    args = parser.parse_args(argv)
    # The command that reproduces this run, recorded in the JSON (also when called from analyses.paper).
    args.command = " ".join([parser.prog, *(sys.argv[1:] if argv is None else argv)])
    if args.n_contexts < 1:
        parser.error(f"--n-contexts must be >= 1, got {args.n_contexts}")
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)  # float reductions depend on the thread count; fix it for reproducibility
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: CUDA is not available on this machine")
    try:
        torch.device(args.device)
    except RuntimeError:
        parser.error(f"--device {args.device!r} is not a torch device (expected cpu, cuda, cuda:0, ...)")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        parser.error(f"--out {out} is a file; expected a folder")
    if not out.exists() and not out.parent.is_dir():
        parser.error(f"--out {out}: parent folder {out.parent} does not exist")
    if not os.access(out if out.exists() else out.parent, os.W_OK):
        parser.error(f"--out {out} is not writable")
    return args


def load_subject(spec: str, device: str = "cpu", key_map=None, config=None) -> Subject:
    """Resolve ``--checkpoint``: 'default', a checkpoint folder, or 'theorem1:beta=B[,from=FOLDER]'."""
    import hashlib

    import models
    from models.checkpoint import checkpoint_hash
    from probes import load_task

    if spec.startswith("theorem1"):
        options = _parse_theorem1(spec)
        folder = options.get("from", str(models.DEFAULT_CHECKPOINT))
        task = load_task(folder)
        beta = float(options.get("beta", 50))
        model = models.theorem1_model(task.pi, task.n_examples, task.seq_len, beta, task.root).to(device)
        digest = hashlib.sha256(f"{spec}|{task.pi.tolist()}".encode()).hexdigest()[:16]
        return Subject(model, task, spec, digest)
    folder = models.DEFAULT_CHECKPOINT if spec == "default" else Path(spec)
    from models.formats import foreign_hash, is_foreign, load_foreign_task

    if is_foreign(folder):  # weight files and Hugging Face folders (models.formats)
        model = models.load(folder, device=device, key_map=key_map, config=config)
        return Subject(model, load_foreign_task(folder, config), str(spec), foreign_hash(folder, key_map, config))
    model = models.load(folder, device=device)
    return Subject(model, load_task(folder), str(spec), checkpoint_hash(folder))


def subject_from_args(args: argparse.Namespace) -> Subject:
    """``load_subject`` with the common flags (--checkpoint, --device, --key-map, --config)."""
    return load_subject(args.checkpoint, args.device, key_map=args.key_map, config=args.config)


def _parse_theorem1(spec: str) -> dict:
    head, _, rest = spec.partition(":")
    options = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in ("beta", "from"):
            raise ValueError(f"bad --checkpoint {spec!r}; expected theorem1:beta=B[,from=FOLDER]")
        options[key] = value
    if head != "theorem1":
        raise ValueError(f"bad --checkpoint {spec!r}; expected theorem1:beta=B[,from=FOLDER]")
    try:
        if float(options.get("beta", 50)) <= 0:
            raise ValueError
    except ValueError:
        raise ValueError(f"bad beta in --checkpoint {spec!r}; expected a positive number") from None
    return options


def sample_contexts(task, n: int, seed: int):
    """``n`` fresh contexts from the task, a function of ``seed`` only."""
    return task.sample(n, torch.Generator().manual_seed(seed))


def _atomic_write(path: Path, write) -> None:
    """``write(tmp_path)`` then rename over ``path``: readers never see a half-written file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_figure(fig, out: str | Path, name: str) -> list[Path]:
    """Write ``name.png`` (README) and ``name.pdf`` (papers) atomically; closes the figure."""
    import matplotlib.pyplot as plt

    out = Path(out)
    out.mkdir(exist_ok=True)
    paths = []
    # No creation date in the PDF: regenerating a figure with the same numbers gives the same bytes.
    for ext, kw in (("png", {"dpi": 150}), ("pdf", {"metadata": {"CreationDate": None}})):
        path = out / f"{name}.{ext}"
        _atomic_write(path, lambda tmp, kw=kw, ext=ext: fig.savefig(tmp, format=ext, bbox_inches="tight", **kw))
        paths.append(path)
    plt.close(fig)
    return paths


def save_json(out: str | Path, name: str, results: dict, args: argparse.Namespace, subject: Subject | None) -> Path:
    """Write ``name.json``: every plotted number plus the command line, seed and checkpoint hash."""
    out = Path(out)
    out.mkdir(exist_ok=True)
    record = {
        "command": getattr(args, "command", None) or "python -m " + " ".join([_module_name(), *sys.argv[1:]]),
        "seed": args.seed,
        "n_contexts": args.n_contexts,
        "checkpoint": None if subject is None else subject.name,
        "checkpoint_hash": None if subject is None else subject.hash,
        "results": results,
    }
    path = out / f"{name}.json"
    _atomic_write(path, lambda tmp: tmp.write_text(json.dumps(record, indent=1, default=_to_json) + "\n"))
    return path


def _module_name() -> str:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return spec.name if spec is not None else Path(sys.argv[0]).stem


def _to_json(obj):
    """Tensors and NumPy values become lists or numbers."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj)}")


def style():
    """The suite's matplotlib style (call once before plotting)."""
    import matplotlib

    matplotlib.use("Agg")
    import seaborn as sns

    sns.set_theme(context="paper", style="whitegrid", font_scale=1.1)


def run(main, argv: list[str] | None = None) -> None:
    """Run an analysis ``main(argv)``; a ValueError becomes a one-line error with exit code 2."""
    try:
        main(argv)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


class single_thread:
    """``with single_thread():`` run torch on one intra-op thread, then restore the previous count: for
    calling an analysis's ``compute`` from Python (its CLI sets ``--threads``, default 1, itself)."""

    def __enter__(self):
        self.previous = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        torch.set_num_threads(self.previous)
