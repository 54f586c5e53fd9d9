"""``analyses.inspect`` on the shipped standard GPT-2 (``--checkpoint standard``), written as its own set
(``inspect_standard.json``, ``inspect_standard_*.png``) so that the paper run keeps both models' reports.

    python -m analyses.inspect_standard                           # the shipped standard GPT-2
    python -m analyses.inspect_standard --checkpoint runs/standard

The figures are ``analyses.inspect``'s (see its docstring for the role profile, the causal weight and the
verdict rules), on a standard transformer: README section "Standard transformers".
"""

from __future__ import annotations

import dataclasses

from analyses import common, inspect

NAME = "inspect_standard"
FIGURES = {
    name.replace(inspect.NAME, NAME, 1): f"{what} On the shipped standard GPT-2 (`--checkpoint standard`)."
    for name, what in inspect.FIGURES.items()
}


def figures(r: dict, args) -> dict:
    """``analyses.inspect``'s figures, filed under ``inspect_standard_*``."""
    return {stem.replace(inspect.NAME, NAME, 1): fig for stem, fig in inspect.figures(r, args).items()}


def add_flags(parser) -> None:
    parser.set_defaults(checkpoint="standard")  # the point of this set: the standard GPT-2


REQUIRES = inspect.REQUIRES  # what it needs of its subject
ANALYSIS = common.register(
    globals(),
    dataclasses.replace(inspect.ANALYSIS, name=NAME, requires=REQUIRES, doc=__doc__, figures=figures, add_flags=add_flags),
)
