"""mkdocs-gen-files script: the pages generated at build time.

- reference/api/: one page per public module (every ``.py`` under the packages whose name does not start with
  ``_``, packages by their ``__init__``), found by walking the packages, so a moved module moves its page;

Nothing is executed: the tutorials are served from their committed renders (``docs/tutorials/rendered/``, written
by ``python docs/scripts/tutorials.py``), and reference/cli.md, every entry point's ``--help``, is committed as
``python docs/scripts/entry_points.py`` writes it from the parsers (a test keeps it equal to them), so the site
builds in seconds.
"""

from pathlib import Path

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["probes", "models", "cape", "analyses", "bench"]


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


api_pages()
