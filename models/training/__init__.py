"""Training: both trainers (``train``: the disentangled model, ``python -m models.train``; ``standard``: a
standard GPT-2, ``python -m models.standard``), what they share (``optim``: the cosine schedule, the stop on
divergence, the training batch), data parallelism (``distributed``), held-out metrics (``evaluate``,
``python -m models.evaluate``), running a sweep's jobs (``sweep``) and short runs with snapshots for the
analyses that watch training (``short_run``). ``models/train/``, ``models/standard/`` and
``models/evaluate/`` hold only a ``__main__.py`` each: launchers that keep those commands as written."""
