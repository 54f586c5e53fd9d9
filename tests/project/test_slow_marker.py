"""The `slow` marker: every entry of ``conftest.SLOW`` names a test function that exists, and a quick run
(``-m "not slow"``) leaves exactly those tests out."""

from __future__ import annotations

import ast
import subprocess
import sys
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


def test_not_slow_leaves_out_exactly_the_slow_tests():
    def collected(*args):
        run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *args], cwd=TESTS.parent,
                             capture_output=True, text=True, check=True)  # fmt: skip
        return {line for line in run.stdout.splitlines() if "::" in line}

    every, quick = collected(), collected("-m", "not slow")
    left_out = {test.split("[")[0].rpartition("/")[2] for test in every - quick}
    assert quick < every and left_out == SLOW
