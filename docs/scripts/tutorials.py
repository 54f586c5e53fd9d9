"""Run the tutorials and commit what they print: ``python docs/scripts/tutorials.py [NAME ...] [--quick --out DIR]``.

A tutorial is a Markdown page (``docs/tutorials/NAME.md``, jupytext's Markdown format) whose ```python blocks run
top to bottom in one namespace. Rendering it runs those blocks in a fresh interpreter with the default thread
count (what a reader has) and writes ``docs/tutorials/rendered/NAME.md``: the page with each block's printed
output (a ```text block titled "Output") and figures (``NAME_<n>.png``) after it, under a first line that
records the source's SHA-256. The site is built from those committed renders and executes nothing;
``tests/project/test_docs.py`` checks that each render is current (its source unchanged since, and the render
exactly the source plus outputs). GitHub shows the renders with their outputs too.

- ``python docs/scripts/tutorials.py``: render every tutorial (one after another, each named as it starts, with
  a line per block and its time) into ``docs/tutorials/rendered/``.
- ``python docs/scripts/tutorials.py your_gpt2``: that one only.
- ``--quick --out DIR``: at the smaller ``# quick:`` sizes (an assignment ``X = FULL  # quick: SMALL``), into
  DIR: the code path in a minute or two, not the page's numbers (what the test suite runs). A quick render is
  never written over the committed ones.
- ``--check``: list the renders that are missing or stale; exit 1 if any is.

A render never replaces its source: an ``--out`` that would (the source's own folder, for a page named like its
render) is refused in one line.

Why this script and not a plugin (checked 2026-12-04): markdown-exec (1.12) and mkdocs-execute-plugin (0.0.9)
execute the blocks at every build, which is what made ``mkdocs build`` take 1,000 s; mkdocs-jupyter (0.27) and
mknotebooks show the outputs stored in ``.ipynb`` notebooks (or execute them at build time) as HTML on the site
only, so GitHub would show notebooks rather than these Markdown pages, and they bring nbconvert and a Jupyter
kernel into the dev extra. What is wanted here, Markdown with outputs written once and served as it is, is the
~100 lines below.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ROOT / "docs" / "tutorials"
RENDERED = SOURCES / "rendered"
BLOCK = re.compile(r"^```python\n(.*?)^```\n", re.S | re.M)
QUICK = re.compile(r"^(\s*[\w, ]+=\s*)(.+?)(\s*#\s*quick:\s*(.+?))\s*$", re.M)
# What a render adds after a ```python block: its output, then its figures.
OUTPUT = re.compile(
    r'(\n```text title="Output"\n.*?^```\n)?((?:\n!\[Figure \d+[^\]]*\]\([\w.-]+\.png\)\n)*)', re.S | re.M
)
HEADER = re.compile(r"^<!-- rendered from docs/tutorials/(\S+\.md), source sha256 ([0-9a-f]{64}); (.*?) -->\n", re.S)
LINK = re.compile(r"(\]\()([^)\s#][^)\s]*)(\))")


def sources() -> list[Path]:
    """Every tutorial source, by name."""
    return sorted(SOURCES.glob("*.md"))


def blocks(text: str) -> list[str]:
    """The page's ```python blocks, in order."""
    return BLOCK.findall(text)


def quick(code: str) -> str:
    """The block with every ``x = FULL  # quick: SMALL`` assignment taking SMALL."""
    return QUICK.sub(lambda m: f"{m.group(1)}{m.group(4)}", code)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Output:
    """What one ```python block printed (stdout and stderr, in order) and the figures it left open."""

    printed: str
    figures: list[str]  # file names, NAME_<n>.png, beside the render


def relink(target: str, names: set[str]) -> str:
    """A link of the source, as seen from rendered/: another tutorial is its render (a sibling), anything else
    relative is one folder up."""
    if re.match(r"[a-z]+:", target) or target.startswith("/") or target.split("#")[0] in names:
        return target
    return "../" + target


def minutes(seconds: str) -> str:
    return f"{float(seconds):.0f} s" if float(seconds) < 120 else f"{float(seconds) / 60:.0f} minutes"


def run_note(note: str) -> str:
    """The sentence under the title that says how the outputs were made, from the header's ``key=value`` note."""
    run = dict(item.split("=", 1) for item in note.split())
    size = "at the smaller `# quick:` sizes" if run["quick"] == "1" else "as written"
    threads = "1 torch thread" if run["threads"] == "1" else f"{run['threads']} torch threads"
    return (
        f"*The outputs below come from running this page {size} on {run['date']}, with {threads}, on a "
        f"{run['cores']}-core machine: {minutes(run['seconds'])} wall at load {run['load']}, "
        f"{minutes(run['cpu'])} of CPU. `python docs/scripts/tutorials.py {run['name']}` runs it again; "
        f"`docs/tutorials/{run['name']}.md` is the page without outputs.*\n"
    )


def compose(source: str, outputs: list[Output], note: str, name: str) -> str:
    """The render of ``source`` (named ``name``): a header recording the source's hash and ``note`` (how it was
    run), the page with a line under its title from the note, its relative links seen from rendered/, and each
    block's output and figures after it."""
    names = {p.name for p in sources()} | {name}
    parts, at, count = [f"<!-- rendered from docs/tutorials/{name}, source sha256 {digest(source)}; {note} -->\n"], 0, 0
    title = re.search(r"^# .*\n", source, re.M)
    for match, output in zip(BLOCK.finditer(source), outputs, strict=True):
        before = LINK.sub(lambda m: m[1] + relink(m[2], names) + m[3], source[at : match.start()])
        if at == 0 and title:
            before = before.replace(title[0], title[0] + "\n" + run_note(note), 1)
        parts.append(before)
        parts.append(match.group(0))
        if output.printed.strip():
            parts.append(f'\n```text title="Output"\n{output.printed.rstrip()}\n```\n')
        for figure in output.figures:
            count += 1
            parts.append(f"\n![Figure {count} of this tutorial]({figure})\n")
        at = match.end()
    parts.append(LINK.sub(lambda m: m[1] + relink(m[2], names) + m[3], source[at:]))
    return "".join(parts)


def outputs_of(render: str) -> list[Output]:
    """The outputs a render holds, block by block (the inverse of ``compose``)."""
    found = []
    for match in BLOCK.finditer(render):
        after = OUTPUT.match(render, match.end())
        printed = after.group(1) or ""
        printed = printed.split("\n", 2)[2].rsplit("```", 1)[0] if printed else ""
        found.append(Output(printed, re.findall(r"\]\(([\w.-]+\.png)\)", after.group(2))))
    return found


def stale(name: str, folder: Path = RENDERED) -> str | None:
    """Why ``folder/name`` is not the current render of ``docs/tutorials/name``, or None when it is: missing, its
    source changed since it was rendered, or the render was edited by hand (it is not exactly the source with
    its recorded outputs)."""
    source, render_path = (SOURCES / name).read_text(), folder / name
    if not render_path.exists():
        return "not rendered"
    render = render_path.read_text()
    header = HEADER.match(render)
    if not header or header[1] != name:
        return "no render header"
    if header[2] != digest(source):
        return "its source changed since it was rendered"
    try:
        again = compose(source, outputs_of(render), header[3], name)
    except ValueError:
        again = None
    if again != render:
        return "the render differs from its source outside the outputs (edited by hand?)"
    missing = [f for o in outputs_of(render) for f in o.figures if not (folder / f).exists()]
    return f"figures missing: {missing}" if missing else None


# tqdm's "desc: 100%|####| 120/120 [00:10<00:00, ...]", and the plain line models.plumbing.progress prints every
# 30 s when stderr is not a terminal (as here): "desc: 3/10 (30%), 0:01:30 elapsed, about 0:03:30 left (...)"
PROGRESS_BAR = re.compile(r"\d+%\|.*\| *\d+/\d+ \[|^[\w. ]+: .*\b\d+:\d\d:\d\d elapsed\b")


class Capture(io.TextIOBase):
    """Stands for stdout and stderr for the whole run, so that a handler that kept the stream it saw at import
    (``transformers``' logger) still writes into the page; ``take`` returns what a block wrote, as a terminal
    shows it once it is done (a line rewritten after a carriage return keeps its last version), without progress
    bars (a terminal shows them while the work runs; on the page they would only add timings)."""

    def __init__(self):
        self.parts: list[str] = []

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.parts.append(text)
        return len(text)

    def take(self) -> str:
        text, self.parts = "".join(self.parts), []
        lines = (line.rstrip("\r").rsplit("\r", 1)[-1] for line in text.split("\n"))
        return "\n".join(line for line in lines if not PROGRESS_BAR.search(line))


def render(page: Path, out: Path, fast: bool) -> None:
    """Execute ``page``'s blocks in this interpreter and write its render and figures into ``out``; a line on
    the real stderr as each block ends."""
    import resource

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    text = page.read_text()
    namespace: dict = {"__name__": "__main__"}
    outputs, figures, start, load = [], 0, time.perf_counter(), os.getloadavg()[0]
    codes = blocks(text)
    out.mkdir(parents=True, exist_ok=True)
    capture, progress = Capture(), sys.stderr
    sys.stdout = sys.stderr = capture
    try:
        for number, code in enumerate(codes, 1):
            began = time.perf_counter()
            exec(compile(quick(code) if fast else code, f"{page.name}, block {number}", "exec"), namespace)
            sys.stdout.flush()
            names = []
            for figure in plt.get_fignums():
                figures += 1
                names.append(f"{page.stem}_{figures}.png")
                plt.figure(figure).savefig(out / names[-1], dpi=110, bbox_inches="tight")
            plt.close("all")
            outputs.append(Output(capture.take(), names))
            print(
                f"  {page.name}: block {number} of {len(codes)} done in {time.perf_counter() - began:.0f} s "
                f"({time.perf_counter() - start:.0f} s so far)",
                file=progress,
                flush=True,
            )
    except BaseException:
        sys.stdout, sys.stderr = sys.__stdout__, progress
        print(capture.take(), file=progress)  # what the failing block printed, before its traceback
        raise
    sys.stdout, sys.stderr = sys.__stdout__, progress
    import torch

    usage = resource.getrusage(resource.RUSAGE_SELF)
    note = (
        f"name={page.stem} quick={int(fast)} date={time.strftime('%Y-%m-%d')} threads={torch.get_num_threads()} "
        f"cores={os.cpu_count()} seconds={time.perf_counter() - start:.0f} cpu={usage.ru_utime + usage.ru_stime:.0f} "
        f"load={load:.1f}-{os.getloadavg()[0]:.1f}"
    )
    tmp = out / f".{page.name}.tmp"
    tmp.write_text(compose(text, outputs, note, page.name))
    tmp.replace(out / page.name)


def run(page: Path, out: Path, fast: bool, timeout: float = 3600) -> float:
    """Render ``page`` into ``out`` in a fresh interpreter (the repository first on the path, the default
    threads); the seconds it took. Its block lines pass through to stderr; a failing block raises."""
    if out.resolve() == page.resolve().parent:
        raise ValueError(f"--out {out} is {page.name}'s own folder: its render would replace it; give another folder")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "MPLBACKEND": "Agg",
    }
    start = time.perf_counter()
    command = [sys.executable, str(Path(__file__).resolve()), "--one", str(page), "--out", str(out)]
    done = subprocess.run([*command, *(["--quick"] if fast else [])], cwd=ROOT, env=env, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"tutorial {page.name} failed (exit {done.returncode}); its traceback is above")
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("names", nargs="*", help="tutorials to render (NAME or docs/tutorials/NAME.md); default: all")
    parser.add_argument("--quick", action="store_true", help="the smaller sizes of '# quick:' comments (needs --out)")
    parser.add_argument("--out", type=Path, help=f"where to write (default: {RENDERED.relative_to(ROOT)})")
    parser.add_argument("--check", action="store_true", help="list missing or stale renders; exit 1 if any")
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # the child: render this page here
    args = parser.parse_args(argv)
    if args.one:
        render(args.one, args.out, args.quick)
        return 0
    known = {p.stem: p for p in sources()}
    wanted = [Path(n).stem if n.endswith(".md") else n for n in args.names] or list(known)
    unknown = [n for n in wanted if n not in known]
    if unknown:
        print(f"error: no tutorial named {', '.join(unknown)}; the tutorials: {', '.join(known)}", file=sys.stderr)
        return 2
    if args.check:  # the renders in --out (default: the committed ones)
        bad = {n: why for n in wanted if (why := stale(f"{n}.md", args.out or RENDERED))}
        for n, why in bad.items():
            print(f"{n}: {why} (python docs/scripts/tutorials.py {n})")
        return 1 if bad else 0
    out = args.out or RENDERED
    if args.quick and out.resolve() == RENDERED.resolve():
        print(
            f"error: --quick renders go to another folder (--out DIR), not over the committed {RENDERED.relative_to(ROOT)}",
            file=sys.stderr,
        )
        return 2
    if out.resolve() == SOURCES.resolve():
        print(
            f"error: --out {args.out} is the tutorials' own folder: a render would replace its source; give another folder",
            file=sys.stderr,
        )
        return 2
    for number, name in enumerate(wanted, 1):
        print(f"[{number}/{len(wanted)}] {name}: rendering into {out}", file=sys.stderr, flush=True)
        seconds = run(known[name], out, args.quick)
        print(f"[{number}/{len(wanted)}] {name}: {seconds:.0f} s wall", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
