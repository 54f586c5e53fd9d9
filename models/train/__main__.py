"""Launcher: ``python -m models.train`` runs ``models.training.train`` (the code lives there). Only this file is here,
so that the command reads as the docs have always written it. The environment is checked before that module
(and torch) is imported: a malformed ``OMP_NUM_THREADS`` is one line, not libgomp's."""

from models import cli


def main(argv: list[str]) -> None:
    from models.training.train import main

    main(argv)


if __name__ == "__main__":
    cli.run_cli(main, prog="python -m models.train")
