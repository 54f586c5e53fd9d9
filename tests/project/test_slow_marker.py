"""The `slow` marker: every entry of ``conftest.SLOW`` names a test function that exists (a stale entry would
leave nothing out and say nothing)."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import SLOW

TESTS = Path(__file__).resolve().parents[1]


def test_every_slow_entry_names_a_test_function():
    files = {p.name: p for p in TESTS.rglob("test_*.py")}
    missing = []
    for entry in sorted(SLOW):
        name, _, function = entry.partition("::")
        tree = ast.parse(files[name].read_text()) if name in files else None
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)} if tree else set()
        if function not in defined:
            missing.append(entry)
    assert missing == []

