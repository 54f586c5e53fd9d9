"""Interventions, written once: zero and mean ablation of heads, patching heads from another run, and the
corrupted contexts that patching compares against. Each returns TransformerLens forward hooks
``[(hook name, fn)]`` for ``Subject.log_probs(tokens, fwd_hooks)`` / ``model.hooks(...)``."""

from __future__ import annotations

import torch
from jaxtyping import Int
from torch import Tensor

from models.subject import Subject


def corrupted_contexts(task, tokens: Int[Tensor, "batch n_tokens"], generator: torch.Generator):
    """The same target sequences with demonstrations from fresh trees G'; returns (tokens, parents G')."""
    corrupted, parents = task.sample(len(tokens), generator)
    corrupted[:, -task.seq_len :] = tokens[:, -task.seq_len :]
    return corrupted, parents


def set_heads(heads, value):
    """A hook setting ``act[:, :, heads]`` (``[batch, pos, head, ...]``) to ``value(act, heads)``."""

    def hook(act: Tensor, hook=None) -> Tensor:
        act = act.clone()
        act[:, :, heads] = value(act, heads)
        return act

    return hook


def ablate(subject: Subject, layer: int, heads: list[int], kind: str = "zero", mean: Tensor | None = None):
    """Hooks that zero-ablate (``kind="zero"``) or mean-ablate (``"mean"``) ``heads`` of ``layer``.
    Mean ablation uses ``mean`` (the layer's ``hook_z`` averaged over contexts, ``[pos, head, d_head]``)
    when given, else the mean over the batch being run."""
    if kind == "zero":
        value = lambda act, h: 0  # noqa: E731
    elif kind == "mean":
        value = (lambda act, h: act[:, :, h].mean(0, keepdim=True)) if mean is None else (lambda act, h: mean[:, h])
    else:
        raise ValueError(f"ablation kind must be 'zero' or 'mean', got {kind!r}")
    return [(subject.head_output(layer), set_heads(list(heads), value))]


@torch.no_grad()
def head_outputs(subject: Subject, tokens: Int[Tensor, "batch n_tokens"], layers=None) -> dict[int, Tensor]:
    """Every layer's per-head outputs (``hook_z``) on ``tokens``, for patching into another run."""
    layers = range(subject.n_layers) if layers is None else layers
    store: dict[int, Tensor] = {}

    def grab(z, hook, layer):  # hook.name may be an alias's canonical name (TransformerBridge)
        store[layer] = z.detach().clone()

    subject.log_probs(tokens, [(subject.head_output(i), lambda z, hook, i=i: grab(z, hook, i)) for i in layers])
    return store


def patch_heads(subject: Subject, layer: int, heads: list[int], source: dict[int, Tensor]):
    """Hooks that replace ``heads`` of ``layer`` by their outputs in ``source`` (``head_outputs``)."""
    return [(subject.head_output(layer), set_heads(list(heads), lambda act, h: source[layer][:, :, h]))]


def ablate_subspace(name: str, dims: slice, kind: str = "zero", mean: Tensor | None = None):
    """Hooks that zero-ablate (``kind="zero"``) or mean-ablate (``"mean"``) the last-axis slice ``dims`` of
    activation ``name`` at every position and head (one residual subspace of ``blocks.1.attn.hook_q``, say).
    Mean ablation uses ``mean`` (the activation averaged over contexts, without the batch axis) when given,
    else the mean over the batch being run."""
    if kind not in ("zero", "mean"):
        raise ValueError(f"ablation kind must be 'zero' or 'mean', got {kind!r}")

    def hook(act: Tensor, hook=None) -> Tensor:
        act = act.clone()
        if kind == "zero":
            act[..., dims] = 0
        else:
            act[..., dims] = (act.mean(0) if mean is None else mean)[..., dims]
        return act

    return [(name, hook)]
