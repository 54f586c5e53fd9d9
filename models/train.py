"""Launcher: ``python -m models.train`` runs ``models.training.train`` (the trainer lives there; this file
only keeps the command as the docs write it)."""

from models.training.train import main

if __name__ == "__main__":
    main()
