"""``python -m ENTRY_POINT --help`` in a fraction of a second: the help texts of every entry point, kept in
``cli_help.json`` beside this file, are printed before torch or transformer_lens is imported (importing
them takes seconds). Each package's ``__init__`` calls ``exit_if_help_asked`` first (``analyses`` and
``bench`` through ``import models``); ``tests/models/plumbing/test_cli_help.py`` fails when a text differs from what the
entry point's own parser prints, and ``UPDATE_CLI_HELP=1 python -m pytest tests/models/plumbing/test_cli_help.py``
rewrites the file. Standard library only.

The same cache refuses, as fast, the two mistakes a user makes most: a flag the entry point does not have
(``exit_if_refused``: argparse's own "unrecognized arguments" line, read against the flags in the cached
usage) and an analysis run on a shipped checkpoint of the wrong family (the line ``analyses.common`` would
print after loading it, cached per analysis and named checkpoint in ``cli_refusals.json``, which the same
test checks and rewrites). Anything the cache cannot decide is left to the entry point's parser.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HELP_FILE = Path(__file__).with_name("cli_help.json")
REFUSALS_FILE = Path(__file__).with_name("cli_refusals.json")  # {analysis module: {checkpoint: error}}
COLUMNS = 100  # the width the texts are formatted at


def module_run() -> tuple[str, list[str]] | None:
    """``(MODULE, its argv)`` of the ``python [options] -m MODULE ...`` that this process is, else None."""
    argv = list(getattr(sys, "orig_argv", []))
    if "-m" not in argv[1:]:
        return None
    at = argv.index("-m", 1)
    return (argv[at + 1], argv[at + 2 :]) if at + 1 < len(argv) else None


def help_asked() -> str | None:
    """The module of ``python [options] -m MODULE ... -h|--help`` that this process is, else None."""
    run = module_run()
    return run[0] if run is not None and {"-h", "--help"} & set(run[1]) else None


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def refusal(help_text: str, refusals: dict, argv: list[str]) -> str | None:
    """The error (without ``prog: error:``) that the entry point whose ``--help`` is ``help_text`` gives
    ``argv`` for an unknown flag, or for a named ``--checkpoint`` that ``refusals`` ({checkpoint: error})
    refuses; None when neither is certain from these texts (the parser then decides)."""
    usage = help_text.split("\n\n")[0]
    flags = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", usage))
    argv = argv[: argv.index("--")] if "--" in argv else argv
    unknown, after_unknown = [], False
    for token in argv:
        if not token.startswith("-") or token == "-" or _is_number(token):
            if after_unknown:
                unknown.append(token)  # a value argparse cannot give to the unknown flag: "unrecognized" too
            continue
        name = token.split("=", 1)[0]
        after_unknown = name not in flags and not (name.startswith("--") and any(f.startswith(name) for f in flags))
        if after_unknown:  # neither a flag nor an abbreviation of one (argparse takes unique prefixes)
            unknown.append(token)
    if unknown:
        return f"unrecognized arguments: {' '.join(unknown)}"
    for i, token in enumerate(argv):
        value = argv[i + 1] if token == "--checkpoint" and i + 1 < len(argv) else None
        value = token.split("=", 1)[1] if token.startswith("--checkpoint=") else value
        if value in refusals:
            return refusals[value]
    return None


def exit_if_refused() -> None:
    """Exit 2 with the one-line error of ``refusal`` (as the entry point's parser prints it), before any
    heavy import; do nothing when the cache cannot decide."""
    run = module_run()
    if run is None:
        return
    try:
        text = json.loads(HELP_FILE.read_text(encoding="utf-8")).get(run[0])
        refusals = json.loads(REFUSALS_FILE.read_text(encoding="utf-8")).get(run[0], {})
    except (OSError, ValueError):
        return
    if not isinstance(text, str) or not isinstance(refusals, dict):
        return
    message = refusal(text, refusals, run[1])
    if message is not None:
        prog = text.split("\n")[0].removeprefix("usage: ").split(" [")[0]
        sys.stderr.write(f"{prog}: error: {message}\n")
        raise SystemExit(2)


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
