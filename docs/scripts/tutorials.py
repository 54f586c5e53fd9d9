"""Run a tutorial and render it: its Markdown with each ```python block's printed output and figures after it.

A tutorial is a Markdown page (jupytext's Markdown format) whose ```python blocks run top to bottom in one
namespace. An assignment ending in ``# quick: VALUE`` takes VALUE instead with ``--quick`` (the test suite's
smaller sizes). Run as a script, in a fresh interpreter: ``python docs/scripts/tutorials.py PAGE OUT [--quick]``
writes ``OUT/PAGE`` (the rendered Markdown) and ``OUT/<page>_<n>.png`` (its figures).
"""

import argparse
import contextlib
import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

BLOCK = re.compile(r"^```python\n(.*?)^```\n", re.S | re.M)
QUICK = re.compile(r"^(\s*[\w, ]+=\s*)(.+?)(\s*#\s*quick:\s*(.+?))\s*$", re.M)
ROOT = Path(__file__).resolve().parents[2]


def blocks(text: str) -> list[str]:
    """The page's ```python blocks, in order."""
    return BLOCK.findall(text)


def quick(code: str) -> str:
    """The block with every ``x = FULL  # quick: SMALL`` assignment taking SMALL."""
    return QUICK.sub(lambda m: f"{m.group(1)}{m.group(4)}", code)


def render(page: Path, out: Path, fast: bool) -> None:
    """Execute ``page``'s blocks in this interpreter and write the rendered page and its figures into ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    text = page.read_text()
    namespace: dict = {"__name__": "__main__"}
    figures = 0

    def after(match: re.Match) -> str:
        nonlocal figures
        code = quick(match.group(1)) if fast else match.group(1)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(code, f"{page.name}, block {after.count}", "exec"), namespace)
        after.count += 1
        parts = [match.group(0)]
        if printed.getvalue().strip():
            parts.append("\n```text\n" + printed.getvalue().rstrip() + "\n```\n")
        for number in plt.get_fignums():
            figures += 1
            name = f"{page.stem}_{figures}.png"
            plt.figure(number).savefig(out / name, dpi=110, bbox_inches="tight")
            parts.append(f"\n![figure {figures} of this tutorial]({name})\n")
        plt.close("all")
        return "".join(parts)

    after.count = 1
    out.mkdir(parents=True, exist_ok=True)
    rendered = BLOCK.sub(after, text)
    (out / page.name).write_text(rendered)


def run(page: Path, out: Path, fast: bool, timeout: float = 1800) -> float:
    """Render ``page`` into ``out`` in a fresh interpreter (one thread, the repository on the path); the seconds it took.
    A failing block raises with the interpreter's output."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    start = time.perf_counter()
    command = [sys.executable, str(Path(__file__).resolve()), str(page), str(out), *(["--quick"] if fast else [])]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"tutorial {page.name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    return time.perf_counter() - start


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("page", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--quick", action="store_true", help="the smaller sizes of '# quick:' comments")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    render(args.page, args.out, args.quick)
