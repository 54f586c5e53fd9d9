"""Loading: everything between a ``--checkpoint`` spec and a model in memory. ``sources`` (``resolve(spec)``
and one module per format in ``FORMATS``), ``loading`` (``models.load``, ``load_task``, ``load_layout``),
``checkpoint`` (our checkpoint folders: ``models.save``, read/write, the shipped checkpoints, which stay in
``models/checkpoints/``), ``converters`` (other pipelines' state dicts -> ``models.nets.hooked_transformer``)
and ``dtypes`` (the one dtype table). A new checkpoint format is one module in ``sources/`` and one line in
``FORMATS``."""
