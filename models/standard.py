"""Launcher: ``python -m models.standard`` runs ``models.training.standard`` (the standard GPT-2 trainer
lives there; this file only keeps the command as the docs write it)."""

from models.training.standard import main

if __name__ == "__main__":
    main()
