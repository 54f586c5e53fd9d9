"""Plumbing shared by every entry point: atomic file writes, JSON of tensors, and the CLI error
convention (bad input is one line on stderr and exit code 2; ``--debug`` keeps the traceback)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path


def atomic_write(path: str | Path, write) -> None:
    """``write(tmp_path)`` then rename over ``path``: readers never see a half-written file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def to_json(obj):
    """``json.dumps(default=to_json)``: tensors and NumPy values become lists or numbers."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj)}")


def write_json(path: str | Path, record) -> None:
    """Write ``record`` (tensors allowed) as indented JSON, atomically."""
    text = json.dumps(record, indent=1, default=to_json) + "\n"
    atomic_write(path, lambda tmp: tmp.write_text(text))


def one_line(e: BaseException) -> str:
    """The first line of an exception's message (or its type name), at most 300 characters."""
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]


def run_cli(main, argv: list[str] | None = None):
    """Run a CLI ``main(argv)``: a ``ValueError`` (bad input) becomes ``error: <one line>`` on stderr and
    exit code 2, without a traceback (``--debug`` in argv re-raises it)."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        return main(args)
    except ValueError as e:
        if "--debug" in args:
            raise
        print(f"error: {one_line(e)}", file=sys.stderr)
        raise SystemExit(2) from None
