"""Launcher: ``python -m models.train`` runs ``models.training.train`` (the trainer lives there).
Only this file is here, so that the command reads as the docs have always written it."""

from models.training.train import main

if __name__ == "__main__":
    main()
