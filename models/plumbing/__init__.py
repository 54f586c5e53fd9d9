"""Plumbing every entry point shares (models, analyses, bench), and the bottom room of ``models``: ``io``
(atomic writes, JSON, locks, memory checks, and the error convention of every command line: ``UsageError``
and ``run_cli``). Nothing here is about the model itself; standard library only, so that it imports nothing
heavy."""
