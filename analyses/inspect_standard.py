"""``analyses.inspect`` on the shipped standard GPT-2 (``--checkpoint standard``), written as its own set
(``inspect_standard.json``, ``inspect_standard_*.png``) so that the paper run keeps both models' reports.

    python -m analyses.inspect_standard                           # the shipped standard GPT-2
    python -m analyses.inspect_standard --checkpoint runs/standard

The figures are ``analyses.inspect``'s (see its docstring for the role profile, the causal weight and the
verdict rules), on a standard transformer: README section "Standard transformers".
"""

from __future__ import annotations

from analyses import common, inspect
from analyses.inspect import Config, compute, summary  # noqa: F401 (this analysis's hooks: inspect's)

NAME = "inspect_standard"
REQUIRES = inspect.REQUIRES  # what it needs of its subject
CHECKPOINT = "standard"  # the default --checkpoint: the point of this set is the standard GPT-2
FIGURES = {
    name.replace(inspect.NAME, NAME, 1): f"{what} On the shipped standard GPT-2 (`--checkpoint standard`)."
    for name, what in inspect.FIGURES.items()
}


def figures(result: common.Result) -> dict:
    """``analyses.inspect``'s figures, filed under ``inspect_standard_*``."""
    return {stem.replace(inspect.NAME, NAME, 1): fig for stem, fig in inspect.figures(result).items()}


ANALYSIS = common.register(globals())
