"""The `slow` and `figures` markers: every entry of ``conftest.SLOW`` and ``conftest.FIGURES`` names a test
function that exists (a stale entry would leave nothing out and say nothing); a test in ``FIGURES`` gets an
analysis's figures rendered, any other a placeholder in the same files."""

from __future__ import annotations

import ast
from pathlib import Path

import inproc
from conftest import FIGURES, PLACEHOLDER, SLOW

TESTS = Path(__file__).resolve().parents[1]


def test_every_slow_and_figures_entry_names_a_test_function():
    files = {p.name: p for p in TESTS.rglob("test_*.py")}
    missing = []
    for entry in sorted({*SLOW, *FIGURES}):
        name, _, function = entry.partition("::")
        tree = ast.parse(files[name].read_text()) if name in files else None
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)} if tree else set()
        if function not in defined:
            missing.append(entry)
    assert missing == []



def _copyers(out: Path) -> list[bytes]:
    """A small analysis run as ``python -m`` runs it, in this process: its two figure files' first bytes."""
    proc = inproc.analysis("copyers", "theorem1:beta=5", out)
    assert proc.returncode == 0, proc.stderr
    assert (out / "copyers.json").is_file()
    return [(out / f"copyers.{ext}").read_bytes()[:100] for ext in ("png", "pdf")]


def test_an_analysis_renders_its_figures_where_asked(tmp_path):
    png, pdf = _copyers(tmp_path)
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and pdf.startswith(b"%PDF-")


def test_elsewhere_its_figures_are_a_placeholder_written_with_its_set(tmp_path):
    assert _copyers(tmp_path) == [PLACEHOLDER, PLACEHOLDER]
