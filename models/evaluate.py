"""Launcher: ``python -m models.evaluate`` runs ``models.training.evaluate`` (held-out metrics live there;
this file only keeps the command as the docs write it)."""

from models.plumbing.cli import run_cli
from models.training.evaluate import main

if __name__ == "__main__":
    run_cli(main)
