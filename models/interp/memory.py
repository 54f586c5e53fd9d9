"""What a forward pass of a model costs in memory, measured on one and two contexts before the real batch is
allocated: ``forward_bytes`` (any forward that takes TransformerLens hooks) and ``check_contexts_fit`` (a
``Subject`` on ``n_contexts`` contexts). Every entry point that loads a subject checks it first
(``models.cli.subject_or_exit``); ``models.training.train`` sizes its batches with it."""

from __future__ import annotations

import warnings

import torch

from models.interp.subject import Subject
from models.plumbing.io import check_memory, size


def forward_bytes(forward, task, n_contexts: int) -> int:
    """Memory ``forward(tokens, fwd_hooks)`` (e.g. ``Subject.log_probs``) takes on ``n_contexts`` contexts of
    ``task``: every activation a hook sees (each storage counted once: the disentangled copyer pattern
    is shared by the batch), plus the contexts and their sampling buffers."""
    tokens, _ = task.sample(n_contexts, torch.Generator().manual_seed(0))
    seen: dict[int, tuple[int, torch.Tensor]] = {}

    def grab(t, hook):
        if isinstance(t, torch.Tensor):  # kept alive, so that no two activations share an address
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = (storage.nbytes(), t)

    with torch.no_grad(), warnings.catch_warnings():  # hooking every name: the bridge warns of gated ones
        warnings.simplefilter("ignore")
        forward(tokens, [(lambda name: True, grab)])
    return sum(n for n, _ in seen.values()) + 3 * tokens.numel() * 8


def check_contexts_fit(subject: Subject, n_contexts: int, flag: str = "--n-contexts") -> None:
    """One-line ``ValueError`` if a forward pass on ``n_contexts`` contexts of ``subject`` would not fit
    in memory: the cost of one more context (measured on 1 and 2) times ``n_contexts``, plus what every
    batch shares. A floor for what an analysis holds."""
    one, two = forward_bytes(subject.log_probs, subject.task, 1), forward_bytes(subject.log_probs, subject.task, 2)
    per = max(two - one, 1)
    check_memory(one - per + per * n_contexts, f"{flag} {n_contexts} ({size(per)} a context)")
