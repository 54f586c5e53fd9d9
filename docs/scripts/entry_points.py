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


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    PAGE.write_text(page())
    print(f"wrote {PAGE.relative_to(ROOT)}")
