"""``python -m ENTRY_POINT --help`` in a fraction of a second: the help texts of every entry point, kept in
``cli_help.json`` beside this file, are printed before torch or transformer_lens is imported (importing
them takes seconds). Each package's ``__init__`` calls ``exit_if_help_asked`` first (``analyses`` and
``bench`` through ``import models``); ``tests/models/plumbing/test_cli_help.py`` fails when a text differs from what the
entry point's own parser prints, and ``UPDATE_CLI_HELP=1 python -m pytest tests/models/plumbing/test_cli_help.py``
rewrites the file. Standard library only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HELP_FILE = Path(__file__).with_name("cli_help.json")
COLUMNS = 100  # the width the texts are formatted at


def help_asked() -> str | None:
    """The module of ``python [options] -m MODULE ... -h|--help`` that this process is, else None."""
    argv = list(getattr(sys, "orig_argv", []))
    if "-m" not in argv[1:]:
        return None
    at = argv.index("-m", 1)
    if at + 1 >= len(argv) or not {"-h", "--help"} & set(argv[at + 2 :]):
        return None
    return argv[at + 1]


def exit_if_help_asked() -> None:
    """Print the cached ``--help`` of the entry point being run and exit 0; do nothing when none was asked
    or none is cached (then argparse prints it as usual)."""
    module = help_asked()
    if module is None:
        return
    try:
        text = json.loads(HELP_FILE.read_text(encoding="utf-8")).get(module)
    except (OSError, ValueError):
        return
    if isinstance(text, str):
        sys.stdout.write(text)
        sys.stdout.flush()
        raise SystemExit(0)
