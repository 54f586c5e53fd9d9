"""Model code: the hooked disentangled model (``causal_transformer``), its continuous variant, the
Theorem 1 construction, standard transformers, loading every format, training and evaluation.

Public names: ``models.load``, ``models.save``, ``models.load_task``, ``models.load_layout``,
``models.load_subject`` (what every analysis probes), ``models.theorem1_model``, and the shipped
checkpoints ``models.DEFAULT_CHECKPOINT`` and ``models.STANDARD_CHECKPOINT``.
"""

from models.plumbing.fast_help import exit_if_help_asked
from models.plumbing.io import drop_bad_thread_variables

exit_if_help_asked()  # `python -m ... --help` answers here, before torch is imported
drop_bad_thread_variables()  # before torch loads: a malformed OMP_NUM_THREADS would make libgomp print

from models.interp.subject import DisentangledSubject, StandardSubject, Subject, load_subject
from models.loading.checkpoint import DEFAULT_CHECKPOINT, STANDARD_CHECKPOINT, save
from models.loading.loading import load, load_layout, load_task
from models.nets.causal_transformer import CausalTransformer, CausalTransformerConfig
from models.nets.theorem1 import theorem1_model

__all__ = [
    "DEFAULT_CHECKPOINT",
    "STANDARD_CHECKPOINT",
    "CausalTransformer",
    "CausalTransformerConfig",
    "DisentangledSubject",
    "StandardSubject",
    "Subject",
    "load",
    "load_layout",
    "load_subject",
    "load_task",
    "save",
    "theorem1_model",
]
