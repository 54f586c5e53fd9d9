"""No block of six or more lines is repeated across the analyses (issue 50): what two analyses share lives once,
in ``analyses.common`` or the library. Lines are compared stripped of indentation and trailing comments; blank
lines, lone brackets and import lines are skipped (a file's imports may well match another's)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WINDOW = 6


def code_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, normalised text) of every line that carries code."""
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        text = re.sub(r"\s+#.*$", "", line).strip()
        if not text or text in {")", "]", "}", "),", "],", "},", '"""'} or text.startswith(("import ", "from ", "#")):
            continue
        out.append((number, text))
    return out


def repeated_blocks(paths: list[Path], window: int = WINDOW) -> list[str]:
    """Every run of ``window`` code lines that occurs in two different files, as 'a.py:12 = b.py:40'."""
    seen: dict[tuple[str, ...], tuple[Path, int]] = {}
    found = []
    for path in paths:
        lines = code_lines(path)
        for i in range(len(lines) - window + 1):
            key = tuple(text for _, text in lines[i : i + window])
            first = seen.setdefault(key, (path, lines[i][0]))
            if first[0] != path:
                found.append(f"{first[0].name}:{first[1]} = {path.name}:{lines[i][0]}")
    return found


def test_the_checker_finds_a_block_repeated_in_two_files(tmp_path):
    block = "\n".join(f"x{i} = f({i})" for i in range(WINDOW))
    (tmp_path / "a.py").write_text(f"import os\n{block}\n")
    (tmp_path / "b.py").write_text(f"def g():\n    pass\n\n{block}  # the same\n")
    (tmp_path / "c.py").write_text("\n".join(f"x{i} = f({i})" for i in range(WINDOW - 1)) + "\n")
    assert repeated_blocks(sorted(tmp_path.glob("*.py"))) == ["a.py:2 = b.py:4"]


def test_no_block_of_six_lines_is_repeated_across_the_analyses():
    assert repeated_blocks(sorted((ROOT / "analyses").glob("*.py"))) == []
