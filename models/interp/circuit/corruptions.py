"""Corruptions: where a sender's ablated value comes from. Each is one ``Corruption`` in ``CORRUPTIONS``
(``register_corruption`` adds one): its name, its words, the other contexts whose run gives the senders'
ablated values, and whether those values are averaged over the contexts (``mean``: then there is no
corrupted run, and no denoising)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from models.interp.circuit.registry import Registry

if TYPE_CHECKING:  # the registry itself loads no torch: the command line's --help lists it before torch loads
    from jaxtyping import Int
    from torch import Tensor

    from models.interp.circuit.graph import Graph
    from models.interp.circuit.runner import Metric, Runner
    from models.interp.subject import Subject

Contexts = Callable[..., "Int[Tensor, 'batch T']"]  # (task, tokens [batch, T], generator) -> other contexts [batch, T]


@dataclass(frozen=True)
class Corruption:
    """One corruption. ``name``: how a config or ``--corruption`` names it; ``words``: what the sender's
    ablated value is; ``means``: what a circuit that keeps the progress under it does (the summary's and the
    JSON's words); ``contexts(task, tokens, generator)``: the contexts, one per context of ``tokens``, whose
    run gives the senders' ablated values; ``averaged``: the ablated value is the writes' mean over those
    contexts, at each position (no corrupted run to denoise from)."""

    name: str
    words: str
    means: str
    contexts: Contexts
    averaged: bool = False

    @property
    def can_denoise(self) -> bool:
        """Whether there is a corrupted run whose edges can be restored (``denoising_runner``)."""
        return not self.averaged

    def other_contexts(self, task, tokens: Int[Tensor, "batch T"], seed: int) -> Int[Tensor, "batch T"]:
        """``contexts`` drawn from ``seed`` (a function of it only)."""
        import torch

        return self.contexts(task, tokens, torch.Generator().manual_seed(seed + 7919))

    def ablated_values(self, subject: Subject, graph: Graph, tokens, seed: int, keep=None) -> dict:
        """The senders' ablated values, ``{(node, site): [batch or 1, pos, D]}``: their writes on
        ``other_contexts``, or (``averaged``) those writes' mean over the contexts; ``keep``: of these nodes only."""
        from models.interp.circuit.runner import mean_writes, sender_writes

        writes = sender_writes(subject, graph, self.other_contexts(subject.task, tokens, seed), keep=keep)[0]
        return mean_writes(writes) if self.averaged else writes


CORRUPTIONS: Registry[Corruption] = Registry("corruption")
register_corruption = CORRUPTIONS.register


def _target_redrawn(task, tokens, g):
    import torch

    other = tokens.clone()
    other[:, -task.seq_len :] = torch.randint(0, task.d_vocab, (len(tokens), task.seq_len), generator=g)
    return other


def _demonstrations_redrawn(task, tokens, g):
    from models.interp.interventions import corrupted_contexts

    return corrupted_contexts(task, tokens, g)[0]


def _fresh(task, tokens, g):
    return task.sample(len(tokens), g)[0]


register_corruption(Corruption(
    "demonstrations", "demonstrations from another tree (the same target)", "carries the demonstrations' evidence",
    _demonstrations_redrawn))  # fmt: skip
register_corruption(Corruption(
    "target", "the target's tokens re-drawn uniformly (the same demonstrations)", "carries the target's own prefix",
    _target_redrawn))  # fmt: skip
register_corruption(
    Corruption(
        "resample", "fresh contexts", "keeps the progress with every other edge resampled from fresh contexts", _fresh
    )
)
register_corruption(Corruption(
    "mean", "the sender's mean over held-out contexts", "keeps the progress with every other edge mean-ablated",
    _fresh, averaged=True))  # fmt: skip


def other_contexts(task, tokens: Int[Tensor, "batch T"], corruption: str, seed: int) -> Int[Tensor, "batch T"]:
    """The contexts whose run gives the senders' ablated values under the corruption named ``corruption``."""
    return CORRUPTIONS[corruption].other_contexts(task, tokens, seed)


def source_writes(subject: Subject, graph: Graph, tokens, corruption: str, seed: int, keep=None) -> dict:
    """The senders' ablated values under the corruption named ``corruption`` (``Corruption.ablated_values``;
    ``keep``: of these nodes only)."""
    return CORRUPTIONS[corruption].ablated_values(subject, graph, tokens, seed, keep)


def denoising_runner(subject: Subject, graph: Graph, tokens, corruption: str, seed: int,
                     metric: Metric | None = None) -> Runner:  # fmt: skip
    """The Runner of the denoising direction: the base run on the corruption's ``other_contexts(tokens)``,
    the senders' values to restore their writes on ``tokens``, the metric (default: the target NLL,
    ``probes.metrics.per_context_nll``) that of ``tokens``' targets."""
    from models.interp.circuit.runner import Runner, sender_writes
    from probes.metrics import per_context_nll

    c = CORRUPTIONS[corruption]
    if not c.can_denoise:
        raise ValueError(f"denoising needs a corruption that is a run on other contexts, not {c.name!r}")
    other = c.other_contexts(subject.task, tokens, seed)
    return Runner(subject, graph, other, sender_writes(subject, graph, tokens)[0], metric or per_context_nll,
                  targets=tokens)
