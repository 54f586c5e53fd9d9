"""What ``--checkpoint`` takes without a path: the shipped checkpoints by name, and the syntax of the Theorem 1
spec (``models.loading.sources.theorem1`` reads it). Paths and strings only: the command line's ``--help``
reads them before torch is imported."""

from __future__ import annotations

from pathlib import Path

CHECKPOINTS = Path(__file__).resolve().parent.parent / "checkpoints"
DEFAULT_CHECKPOINT = CHECKPOINTS / "default"  # the shipped disentangled model (README)
STANDARD_CHECKPOINT = CHECKPOINTS / "standard"  # the shipped standard GPT-2 (models.standard)
NAMED = {"default": DEFAULT_CHECKPOINT, "standard": STANDARD_CHECKPOINT}
THEOREM1 = "theorem1"  # ``--checkpoint theorem1:beta=B[,from=FOLDER]``: the construction, not a file
THEOREM1_USAGE = f"{THEOREM1}:beta=B[,from=FOLDER]"
