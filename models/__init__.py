"""Model code: the hooked disentangled model (``causal_transformer``), its continuous variant, the
Theorem 1 construction, standard transformers, loading every format, training and evaluation.

Public names: ``models.load``, ``models.save``, ``models.load_task``, ``models.load_layout``,
``models.load_subject`` (what every analysis probes), ``models.theorem1_model``, and the shipped
checkpoints ``models.DEFAULT_CHECKPOINT`` and ``models.STANDARD_CHECKPOINT``.

Importing ``models`` only defines these names: each is imported from its module on first use (PEP 562), so
that ``import models`` loads no torch, reads no argument and changes no environment variable.

Its rooms, each importing only the rooms below it (``tests/project/test_layering.py``): ``plumbing`` (files,
JSON, locks, the error convention), ``nets`` (the networks), ``loading`` (a ``--checkpoint`` to a model),
``interp`` (what the analyses do to a model), ``cli`` (the command-line convention), ``training``.
"""

from __future__ import annotations

from models.plumbing.lazy import lazy_names

_PUBLIC = {  # name -> the module that defines it
    "DEFAULT_CHECKPOINT": "models.loading.named",
    "STANDARD_CHECKPOINT": "models.loading.named",
    "CausalTransformer": "models.nets.causal_transformer",
    "CausalTransformerConfig": "models.nets.causal_transformer",
    "DisentangledSubject": "models.interp.subject",
    "StandardSubject": "models.interp.subject",
    "Subject": "models.interp.subject",
    "load": "models.loading.loading",
    "load_layout": "models.loading.loading",
    "load_subject": "models.interp.subject",
    "load_task": "models.loading.loading",
    "save": "models.loading.checkpoint",
    "theorem1_model": "models.nets.theorem1",
}
__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = lazy_names(globals(), _PUBLIC)
