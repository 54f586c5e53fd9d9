"""Launcher: ``python -m models.evaluate`` runs ``models.training.evaluate`` (held-out metrics live there).
Only this file is here, so that the command reads as the docs have always written it."""

from models.cli import run_cli
from models.training.evaluate import main

if __name__ == "__main__":
    run_cli(main, prog="python -m models.evaluate")
