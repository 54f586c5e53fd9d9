"""Plumbing every entry point shares (models, analyses, bench): ``cli`` (the one CLI convention: flags,
checks, one-line errors, exit 2), ``io`` (atomic writes, JSON, locks, memory checks), ``progress`` (a stage's
progress: a tqdm bar on a terminal, else a plain line at least every 30 s with an estimate of the time left)
and ``fast_help`` (every entry point's ``--help`` from ``cli_help.json``, before torch is imported). Nothing here is about
the model itself. Standard library only at import: ``models/__init__`` imports ``fast_help`` and ``io``
before torch."""
