"""Every entry point of the suite and the ``--help`` its own parser prints, read in this process: ``python
docs/scripts/entry_points.py`` writes ``docs/reference/cli.md`` from them (the site executes nothing when it is
built), and ``tests/models/plumbing/test_cli_help.py`` checks that page against the parsers and that ``python -m
NAME --help`` prints the same, before torch is imported."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import sys
from pathlib import Path

COLUMNS = 100  # the width the reference page's texts are formatted at
ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "cli.md"
CONFIGS = ROOT / "docs" / "reference" / "analyses.md"


def entry_points() -> dict[str, str]:
    """``python -m NAME`` -> the module whose ``main(argv)`` (or ``parse_args(argv)``) parses its flags."""
    from analyses import common

    return {
        **{f"analyses.{name}": f"analyses.{name}" for name in [*common.analysis_names(), "paper"]},
        "models.train": "models.training.train",
        "models.standard": "models.training.standard",
        "models.evaluate": "models.training.evaluate",
        "bench": "bench.__main__",
    }


def parser_of(name: str) -> argparse.ArgumentParser:
    """The parser the entry point ``name`` builds, caught at its ``parse_args`` before any work."""

    class Caught(Exception):
        pass

    def catch(self, *args, **kwargs):
        raise Caught(self)

    module = importlib.import_module(entry_points()[name])
    run = getattr(module, "parse_args", module.main)  # main may catch every exception (run_cli)
    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = catch
    try:
        run([])
    except Caught as caught:
        return caught.args[0]
    finally:
        argparse.ArgumentParser.parse_args = original
    raise AssertionError(f"{name} parsed no flags")


def help_text(name: str) -> str:
    """What ``python -m NAME --help`` prints, at ``COLUMNS`` characters."""
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(COLUMNS)
    try:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            parser_of(name).print_help()
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before
    return out.getvalue()


def page() -> str:
    """``docs/reference/cli.md``: every entry point's ``--help``."""
    text = [
        "# Entry points\n",
        "Every entry point's flags, as its own `--help` prints them (written by `python "
        "docs/scripts/entry_points.py` from each entry point's own parser, which a test keeps it equal to).\n",
    ]
    for name in entry_points():
        text.append(f"## `{name}`\n\n```text\n{help_text(name).rstrip()}\n```\n")
    return "\n".join(text)


def cell(text) -> str:
    """A value as a Markdown table cell: code for values, pipes escaped, one line."""
    return " ".join(str(text).replace("|", "\\|").split())


def configs_page() -> str:
    """``docs/reference/analyses.md``: every analysis as a Python call, with a table of its config's fields (type,
    default, what it does), what it needs of its subject and the figures its result gives."""
    from dataclasses import MISSING, fields

    from analyses import common

    text = [
        "# Analyses from Python\n",
        "Every analysis is one call, `analyses.<name>.run(subject, analyses.<name>.Config(...))`, returning a result "
        "with `summary()`, `figures()` (matplotlib figures by file stem), `to_dict()` (the JSON the command line "
        "writes) and `save(folder)`; [use the suite from a notebook](../howto/notebook.md) shows them at work. A "
        "config is a frozen dataclass: each field below is also the flag `--field-name` of `python -m "
        "analyses.<name>` ([entry points](cli.md)), checked by type and range when the config is made. Written by "
        "`python docs/scripts/entry_points.py` from the configs themselves, which a test keeps it equal to.\n",
    ]
    for name, analysis in common.registry().items():
        about = (analysis.doc or "").strip().split("\n\n")[0].replace("\n", " ")
        subject = ("`None` (it studies tasks of its own)" if analysis.requires is None else
                   "a `models.Subject` with " + ", ".join(sorted(analysis.requires)))  # fmt: skip
        text.append(f"## `{name}`\n\n{about}\n\n`run(subject, config)`: subject {subject}.\n")
        rows = ["| field | type | default | what it does |", "| --- | --- | --- | --- |"]
        for f in fields(analysis.config):
            default = "" if f.default is MISSING else f"`{f.default!r}`"
            rows.append(f"| `{f.name}` | `{cell(f.type)}` | {cell(default)} | {cell(f.metadata.get('help', ''))} |")
        text.append("\n".join(rows) + "\n")
        module = importlib.import_module(f"analyses.{name}")
        stems = [f.rsplit(".", 1)[0] for f in getattr(module, "FIGURES", {}) if f.endswith(".png")]
        if stems:
            text.append("Figures: " + ", ".join(f"`{s}`" for s in stems) + ".\n")
    return "\n".join(text)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    PAGE.write_text(page())
    CONFIGS.write_text(configs_page())
    print(f"wrote {PAGE.relative_to(ROOT)} and {CONFIGS.relative_to(ROOT)}")
