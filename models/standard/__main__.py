"""Launcher: ``python -m models.standard`` runs ``models.training.standard`` (the standard GPT-2 trainer lives there).
Only this file is here, so that the command reads as the docs have always written it."""

from models.training.standard import main

if __name__ == "__main__":
    main()
