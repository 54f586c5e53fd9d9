"""What a forward pass of a model costs in memory, measured on one and two contexts before the real batch is
allocated: ``forward_bytes`` (any forward that takes TransformerLens hooks: every activation, or those alive at
once), ``forward_peak`` (a ``Subject``'s pass at its peak) and ``check_contexts_fit`` (a ``Subject`` on
``n_contexts`` contexts). Every entry point that loads a subject checks it first
(``models.cli.subject_or_exit``); ``models.training.train`` sizes its batches with it."""

from __future__ import annotations

import warnings
import weakref

import torch

from models.interp.subject import Subject
from models.plumbing.io import check_memory, size


def forward_bytes(forward, task, n_contexts: int, live: bool = False) -> int:
    """Memory ``forward(tokens, fwd_hooks)`` (e.g. ``Subject.log_probs``) takes on ``n_contexts`` contexts of
    ``task``: every activation a hook sees (each storage counted once: the disentangled copyer pattern
    is shared by the batch; what a backward pass keeps), or with ``live`` the most of them alive at one
    time (what a pass without gradients holds at its peak: a block's activations are freed as the next one
    runs), plus the contexts and their sampling buffers."""
    tokens, _ = task.sample(n_contexts, torch.Generator().manual_seed(0))
    seen: dict[int, tuple[int, torch.Tensor]] = {}
    alive: list[weakref.ref] = []
    peak = 0

    def grab(t, hook):
        nonlocal peak, alive
        if not isinstance(t, torch.Tensor):
            return
        if not live:  # kept alive, so that no two activations share an address
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = (storage.nbytes(), t)
            return
        alive = [r for r in alive if r() is not None] + [weakref.ref(t)]
        held = {s.data_ptr(): s.nbytes() for s in (r().untyped_storage() for r in alive if r() is not None)}
        peak = max(peak, sum(held.values()))

    with torch.no_grad(), warnings.catch_warnings():  # hooking every name: the bridge warns of gated ones
        warnings.simplefilter("ignore")
        # every name but the unembedding's: a hook there makes the read-out run the full vocabulary
        # (``subject.on_the_logits``), which the analyses' passes never do
        forward(tokens, [(lambda name: "unembed" not in name, grab)])
    held = peak if live else sum(n for n, _ in seen.values())
    return held + 3 * tokens.numel() * 8


def forward_peak(subject: Subject) -> tuple[int, int]:
    """(the memory a forward pass of ``subject`` without gradients holds at its peak on one context, what one
    more context adds), measured on 1 and 2 contexts (``forward_bytes`` with ``live``). A model with an
    unembedding reads the task's columns alone (``models.interp.subject.task_logits``), so neither grows with
    its vocabulary: a GPT-2 small reading 42 positions, 2.2 MB a context (42.0 MB counted as every activation
    a hook sees, the logits over its 50,257 tokens included, before)."""
    one, two = (forward_bytes(subject.log_probs, subject.task, n, live=True) for n in (1, 2))
    return one, max(two - one, 1)


def check_contexts_fit(subject: Subject, n_contexts: int, flag: str = "--n-contexts") -> None:
    """One-line ``ValueError`` if a forward pass on ``n_contexts`` contexts of ``subject`` would not fit
    in memory: what one more context adds at the pass's peak (``forward_peak``) times ``n_contexts``, plus
    what every batch shares. A floor for what an analysis holds."""
    one, per = forward_peak(subject)
    check_memory(one - per + per * n_contexts, f"{flag} {n_contexts} ({size(per)} a context)")


def flops_per_context(subject) -> float:
    """Floating-point operations of one forward pass on one context, from the weights: 2 x the parameters of
    the model's blocks x the positions it reads (the attention's own products, which grow with the square of
    the positions, left out: small at these lengths; the embeddings and the unembedding, which the task's
    read-out touches in a few columns only, left out). A weight held twice (a TransformerBridge's W_Q, W_K, W_V
    are views of GPT-2's joint c_attn) counts once."""
    blocks = getattr(subject.model, "blocks", subject.model)
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() // p.element_size() for p in blocks.parameters()}
    return 2.0 * sum(storages.values()) * subject.layout.n_positions
