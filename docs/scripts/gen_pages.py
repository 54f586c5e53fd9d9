"""mkdocs-gen-files script: the pages generated at build time.

- reference/api/: one page per public module (every ``.py`` under the packages whose name does not start with
  ``_``, packages by their ``__init__``), found by walking the packages, so a moved module moves its page;
- reference/cli.md: every entry point's ``--help``, as its own parser prints it (``entry_points.py``);
- tutorials/: each tutorial executed and rendered with its output and figures (``tutorials.py``). With
  ``DOCS_TUTORIALS_RENDERED=DIR`` the pages already rendered into DIR are taken instead (the test suite renders
  them once, at its smaller sizes, and builds the site from those).
"""

import os
import sys
import tempfile
from pathlib import Path

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["probes", "models", "cape", "analyses", "bench"]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import entry_points  # noqa: E402
import tutorials  # noqa: E402


def public_modules() -> list[str]:
    """Every public module of the packages, as a dotted name, in file order."""
    names = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if any(p.startswith("_") for p in parts) or any(p in ("checkpoints",) for p in parts):
                continue
            names.append(".".join(parts))
    return names


def api_pages() -> None:
    index = [
        "# API reference\n",
        "Generated from the docstrings: one page per public module, found by walking "
        f"the packages ({', '.join(f'`{p}`' for p in PACKAGES)}).\n",
    ]
    for name in public_modules():
        with mkdocs_gen_files.open(f"reference/api/{name}.md", "w") as page:
            page.write(f"# `{name}`\n\n::: {name}\n")
        depth = name.count(".")
        index.append(f"{'  ' * depth}- [`{name}`]({name}.md)")
    with mkdocs_gen_files.open("reference/api/index.md", "w") as page:
        page.write("\n".join(index) + "\n")


def cli_page() -> None:
    text = [
        "# Entry points\n",
        "Every entry point's flags, as `python -m NAME --help` prints them (read from each entry point's own "
        "parser when the site is built).\n",
    ]
    for name in entry_points.entry_points():
        text.append(f"## `{name}`\n\n```text\n{entry_points.help_text(name).rstrip()}\n```\n")
    with mkdocs_gen_files.open("reference/cli.md", "w") as page:
        page.write("\n".join(text))


def tutorial_pages() -> None:
    ready = os.environ.get("DOCS_TUTORIALS_RENDERED")
    with tempfile.TemporaryDirectory() as scratch:
        for source in sorted((ROOT / "docs" / "tutorials").glob("*.md")):
            folder = Path(ready) if ready else Path(scratch)
            if not ready:
                tutorials.run(source, folder, fast=False)
            for made in [folder / source.name, *sorted(folder.glob(f"{source.stem}_*.png"))]:
                mode = "w" if made.suffix == ".md" else "wb"
                with mkdocs_gen_files.open(f"tutorials/{made.name}", mode) as out:
                    out.write(made.read_text() if mode == "w" else made.read_bytes())


api_pages()
cli_page()
tutorial_pages()
