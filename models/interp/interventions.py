"""Interventions as data, written once: WHAT is intervened on (a TransformerLens hook name, and within its
activation the heads, the positions and a last-axis slice such as one residual subspace) and HOW (zero,
mean, patch from another run, or add a change; or record it, changing nothing), as one small frozen
dataclass that builds its TransformerLens forward hook and describes itself for a result's JSON.

    Intervention("blocks.0.attn.hook_z", "mean", heads=(3,), value=mean_z)      # mean-ablate L0H3
    Intervention("blocks.1.attn.hook_q", "zero", dims=(0, 5))                   # zero the query's token subspace
    Intervention("blocks.0.attn.hook_z", "patch", heads=(1,), value=z_clean, source="clean run")
    Intervention("blocks.1.attn.hook_attn_scores", "record", store=kept)        # kept[hook] = the live tensor

``hooks(interventions, log)`` turns a list into ``fwd_hooks`` for ``Subject.log_probs(tokens, fwd_hooks)`` /
``model.hooks(...)`` and appends each one's description (``describe``: everything but the tensor) to ``log``
once, so an analysis's JSON lists the interventions it ran. Axes: ``positions`` index axis 1 of the
activation (``[batch, pos, ...]``: for the disentangled model's layer-1 hooks, the H target rows),
``heads`` axis 2 (``[batch, pos, head, ...]`` activations only), ``dims`` the last axis. ``value``: for
"mean", the activation averaged over contexts (no batch axis; None: the mean over the batch being run);
for "patch", the source run's activation (``[batch, ...]``); for "add", the change. Only the selected
entries are replaced (``torch.where`` on a mask), so the rest of the activation is bit for bit as it was.
"record" puts the activation itself (not a copy: gradients flow through it) into ``store[hook]`` and
passes it on unchanged; it selects nothing (no heads, positions or dims).

The helpers below (``ablate``, ``patch_heads``, ``ablate_subspace``) build Interventions; ``head_outputs``,
``recorded_run`` and ``corrupted_contexts`` make the runs they patch from. Many small interventions (one head
each) run at once with ``run_copies``: the contexts repeated once per intervention along the batch, as many
rows a pass as fit in the memory a pass may take (``rows_per_pass``); ``activation_grads`` gives the gradient
of each context's metric at any hooks, what attribution patching multiplies by a change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import torch
from jaxtyping import Float, Int
from torch import Tensor

from models.interp.subject import Subject
from models.plumbing.io import MEMORY_FRACTION, memory_limit

KINDS = ("zero", "mean", "patch", "add", "record")


@dataclass(frozen=True)
class Intervention:
    """One intervention; see the module docstring. ``source`` names, in words, where ``value`` came from
    (``"clean run"``, ``"demonstrations from another tree"``, ``"mean over 2048 held-out contexts"``)."""

    hook: str
    kind: str = "zero"
    heads: tuple[int, ...] | None = None
    positions: tuple[int, ...] | None = None
    dims: tuple[int, int] | None = None
    source: str | None = None
    value: Tensor | None = field(default=None, repr=False, compare=False)
    store: dict | None = field(default=None, repr=False, compare=False)  # "record": where the activation goes

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"intervention kind must be one of {list(KINDS)}, got {self.kind!r}")
        if (self.kind == "record") != (self.store is not None):
            raise ValueError(f"{self.hook}: a store is for a 'record' intervention, and a 'record' needs one")
        if self.kind == "record" and (self.heads, self.positions, self.dims) != (None, None, None):
            raise ValueError(f"a 'record' intervention on {self.hook} keeps the whole activation: no heads, "
                             "positions or dims")  # fmt: skip
        if self.kind in ("patch", "add") and self.value is None:
            raise ValueError(f"a {self.kind!r} intervention on {self.hook} needs a value (the source activation)")
        for name in ("heads", "positions"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(int(i) for i in getattr(self, name)))
        if self.dims is not None:
            object.__setattr__(self, "dims", (int(self.dims[0]), int(self.dims[1])))

    def mask(self, act: Tensor) -> Tensor:
        """Boolean mask over ``act.shape[1:]`` (no batch axis) of the entries intervened on."""
        shape = act.shape[1:]
        if self.heads is not None and len(shape) < 3:
            raise ValueError(f"{self.hook} is {list(act.shape)}: no head axis for heads={list(self.heads)}")
        keep = torch.ones(shape, dtype=torch.bool, device=act.device)
        for axis, index in ((0, self.positions), (1, self.heads)):
            if index is not None:
                sel = torch.zeros(shape[axis], dtype=torch.bool, device=act.device)
                sel[list(index)] = True
                keep &= sel.view(-1, *([1] * (len(shape) - axis - 1)))
        if self.dims is not None:
            sel = torch.zeros(shape[-1], dtype=torch.bool, device=act.device)
            sel[self.dims[0] : self.dims[1]] = True
            keep &= sel
        return keep

    def apply(self, act: Tensor) -> Tensor:
        """The activation with this intervention applied (a new tensor; "record": ``act`` itself, stored)."""
        if self.kind == "record":
            self.store[self.hook] = act
            return act
        if self.kind == "zero":
            new = torch.zeros((), dtype=act.dtype, device=act.device)
        elif self.kind == "mean":
            new = act.mean(0, keepdim=True) if self.value is None else self.value.to(act.device, act.dtype)
        elif self.kind == "patch":
            new = self.value.to(act.device, act.dtype)
        else:
            new = act + self.value.to(act.device, act.dtype)
        return torch.where(self.mask(act), new, act)

    def fwd_hook(self):
        """``(hook name, fn)`` for ``fwd_hooks``."""
        return (self.hook, lambda act, hook=None: self.apply(act))

    def describe(self) -> dict:
        """Everything but the tensor: what the result's JSON records."""
        return description(self.hook, self.kind, self.source, self.heads, self.positions, self.dims)


def description(hook: str, kind: str, source: str | None = None, heads=None, positions=None, dims=None) -> dict:
    """What the JSON records of an intervention on ``hook``: also for one that another library runs
    (``transformer_lens.patching``'s sweeps), whose tensors never pass through an ``Intervention``."""
    as_list = lambda x: None if x is None else [int(i) for i in x]  # noqa: E731
    return {"hook": hook, "kind": kind, "heads": as_list(heads), "positions": as_list(positions),
            "dims": as_list(dims), "source": source}  # fmt: skip


def hooks(interventions, log: list | None = None) -> list:
    """``fwd_hooks`` for ``interventions``; each one's ``describe()`` is appended to ``log`` (once)."""
    interventions = list(interventions)
    if log is not None:
        for iv in interventions:
            log_intervention(log, iv)
    return [iv.fwd_hook() for iv in interventions]


def log_intervention(log: list, iv: Intervention | dict) -> None:
    """Append ``iv``'s description to ``log`` unless it is there already."""
    d = iv.describe() if isinstance(iv, Intervention) else iv
    if d not in log:
        log.append(d)


def corrupted_contexts(task, tokens: Int[Tensor, "batch n_tokens"], generator: torch.Generator):
    """The same target sequences with demonstrations from fresh trees G'; returns (tokens, parents G')."""
    corrupted, parents = task.sample(len(tokens), generator)
    corrupted[:, -task.seq_len :] = tokens[:, -task.seq_len :]
    return corrupted, parents


def checked_heads(subject: Subject, layer: int, heads) -> tuple[int, ...]:
    """``heads`` as a tuple of head indices of ``layer`` (integers in range); else a ``TypeError`` or ``ValueError``
    naming what was given and what ``subject`` has."""
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < subject.n_layers:
        raise ValueError(f"layer {layer!r}: the model has layers 0..{subject.n_layers - 1}")
    if isinstance(heads, (str, bytes)) or not hasattr(heads, "__iter__"):
        raise TypeError(f"heads must be a list of head indices of layer {layer} (e.g. [0, 3]), got {heads!r}")
    heads = tuple(heads)
    n = subject.n_heads[layer]
    for h in heads:
        if isinstance(h, bool) or not isinstance(h, int):
            raise TypeError(f"heads must be a list of head indices of layer {layer} (e.g. [0, 3]), got {heads!r}")
        if not 0 <= h < n:
            raise ValueError(f"head {h} of layer {layer}: layer {layer} has heads 0..{n - 1}")
    return heads


def head_ablation(subject: Subject, layer: int, heads, kind: str = "zero", mean: Tensor | None = None) -> Intervention:
    """Zero-ablate (``kind="zero"``) or mean-ablate (``"mean"``) ``heads`` of ``layer``'s ``hook_z``. Mean
    ablation uses ``mean`` (``hook_z`` averaged over contexts, ``[pos, head, d_head]``) when given, else
    the mean over the batch being run."""
    if kind not in ("zero", "mean"):
        raise ValueError(f"ablation kind must be 'zero' or 'mean', got {kind!r}")
    heads = checked_heads(subject, layer, heads)
    source = None if kind == "zero" else ("mean over the batch" if mean is None else "mean over contexts")
    return Intervention(subject.head_output(layer), kind, heads=heads, source=source, value=mean)


def ablate(subject: Subject, layer: int, heads: list[int], kind: str = "zero", mean: Tensor | None = None, log=None):
    """Hooks of ``head_ablation(subject, layer, heads, kind, mean)``."""
    return hooks([head_ablation(subject, layer, heads, kind, mean)], log)


@torch.no_grad()
def head_outputs(subject: Subject, tokens: Int[Tensor, "batch n_tokens"], layers=None) -> dict[int, Tensor]:
    """Every layer's per-head outputs (``hook_z``) on ``tokens``, for patching into another run."""
    layers = list(range(subject.n_layers) if layers is None else layers)
    store = recorded_run(subject, tokens, [subject.head_output(i) for i in layers])[1]
    return {i: store[subject.head_output(i)] for i in layers}


@torch.no_grad()
def recorded_run(subject: Subject, tokens: Int[Tensor, "batch n_tokens"], names: list[str], fwd_hooks=()):
    """``(log_probs [batch, H, d], {name: a copy of the activation there})`` of one pass on ``tokens``."""
    store: dict[str, Tensor] = {}

    def grab(act, hook, name):  # hook.name may be an alias's canonical name (TransformerBridge)
        store[name] = act.detach().clone()

    lp = subject.log_probs(tokens, [*fwd_hooks, *((name, partial(grab, name=name)) for name in names)])
    return lp, store


def head_patch(subject: Subject, layer: int, heads, source: dict[int, Tensor], name: str = "clean run") -> Intervention:
    """Replace ``heads`` of ``layer`` by their outputs in ``source`` (``head_outputs`` of the run ``name``)."""
    return Intervention(subject.head_output(layer), "patch", heads=tuple(heads), source=name, value=source[layer])


def patch_heads(subject: Subject, layer: int, heads: list[int], source: dict[int, Tensor], log=None, name="clean run"):
    """Hooks of ``head_patch``."""
    return hooks([head_patch(subject, layer, heads, source, name)], log)


def subspace_ablation(name: str, dims: slice, kind: str = "zero", mean: Tensor | None = None) -> Intervention:
    """Zero-ablate (``kind="zero"``) or mean-ablate (``"mean"``) the last-axis slice ``dims`` of
    activation ``name`` at every position and head (one residual subspace of ``blocks.1.attn.hook_q``, say).
    Mean ablation uses ``mean`` (the activation averaged over contexts, without the batch axis) when given,
    else the mean over the batch being run."""
    if kind not in ("zero", "mean"):
        raise ValueError(f"ablation kind must be 'zero' or 'mean', got {kind!r}")
    source = None if kind == "zero" else ("mean over the batch" if mean is None else "mean over contexts")
    return Intervention(name, kind, dims=(dims.start or 0, dims.stop), source=source, value=mean)


def ablate_subspace(name: str, dims: slice, kind: str = "zero", mean: Tensor | None = None, log=None):
    """Hooks of ``subspace_ablation``."""
    return hooks([subspace_ablation(name, dims, kind, mean)], log)


# Many interventions at once --------------------------------------------------------------------------------
BATCH_MEMORY = 2**29  # bytes a batched pass may hold on a CPU (the suite's memory bound, if lower): with a GPT-2
# small's weights and what analyses.inspect keeps, its run stays within 3 GB
MAX_ROWS = {"cpu": 512, "cuda": 8192}  # contexts x copies a pass: on a CPU, larger passes spend their time
# faulting in fresh memory (bench's circuit rows); on a GPU, what fits


def rows_per_pass(per_context: int, device: str = "cpu", factor: float = 1.0) -> int:
    """How many rows (contexts x copies) one pass runs: as many as fit in the memory a pass may take
    (``BATCH_MEMORY`` on a CPU, the device's free memory on a GPU, never more than the suite's bound
    ``models.plumbing.io.MEMORY_FRACTION`` of what is available), at ``factor`` x ``per_context`` bytes a
    row (``models.interp.memory.forward_peak``: a forward pass's own peak; ``factor`` for what the pass keeps
    beyond it), at most ``MAX_ROWS`` of the device, at least one."""
    kind = "cuda" if str(device).startswith("cuda") else "cpu"
    available, _ = memory_limit(device)
    budget = MEMORY_FRACTION * available if kind == "cuda" else min(BATCH_MEMORY, MEMORY_FRACTION * available)
    return int(max(1, min(MAX_ROWS[kind], budget // max(factor * per_context, 1))))


def even_parts(n: int, rows: int) -> int:
    """The size of the parts that split ``n`` contexts into passes of at most ``rows``, all but the last
    equal and as few as possible (128 contexts at 116 rows a pass: two passes of 64, not 116 and 12)."""
    return -(-n // -(-n // max(1, rows)))


def _on_contexts(iv: Intervention, rows: slice) -> Intervention:
    """``iv`` for the contexts ``rows`` of the batch it was made for: a patch's source activation sliced."""
    if iv.kind == "patch":
        return Intervention(iv.hook, iv.kind, iv.heads, iv.positions, iv.dims, iv.source, iv.value[rows])
    if iv.kind == "mean" and iv.value is None:
        raise ValueError(f"a mean ablation of {iv.hook} over a batch split into passes needs its mean as value")
    if iv.kind in ("add", "record"):
        raise ValueError(f"an {iv.kind!r} intervention is not run in split passes")
    return iv


def _copy_hooks(copies: list[list[Intervention]], n: int) -> list:
    """Forward hooks for ``copies`` of ``n`` contexts stacked along the batch: copy c's interventions on
    its rows ``c * n .. (c + 1) * n`` alone."""
    edits: dict[str, list] = {}
    for c, ivs in enumerate(copies):
        for iv in ivs:
            edits.setdefault(iv.hook, []).append((slice(c * n, (c + 1) * n), iv))

    def edit(act, hook=None, todo=()):
        act = act.clone()
        for rows, iv in todo:
            act[rows] = iv.apply(act[rows])
        return act

    return [(name, partial(edit, todo=todo)) for name, todo in edits.items()]


@torch.no_grad()
def run_copies(subject: Subject, tokens: Int[Tensor, "batch n_tokens"], copies: list[list[Intervention]],
               rows: int, bar=None) -> Float[Tensor, "copies batch H d"]:  # fmt: skip
    """The log-probs of the contexts ``tokens`` under each entry of ``copies`` (a list of Interventions made
    for the whole batch): the copies stacked along the batch dimension, ``rows`` rows (contexts x copies) a
    pass, so that many small interventions (one head each) share passes that fill the memory a pass may
    take (``rows_per_pass``); a batch larger than ``rows`` is split into passes of its contexts. ``bar``
    (``models.plumbing.progress.progress``) counts one per copy and context run."""
    n = len(tokens)
    per = max(1, rows // n)  # copies a pass
    step = n if per > 1 or rows >= n else even_parts(n, rows)  # contexts a pass
    out = []
    for start in range(0, len(copies), per):
        group = copies[start : start + per]
        parts = []
        for first in range(0, n, step):
            part = slice(first, min(first + step, n))
            ivs = [[_on_contexts(iv, part) for iv in c] for c in group] if step < n else group
            m = part.stop - part.start
            lp = subject.log_probs(tokens[part].repeat(len(group), 1), _copy_hooks(ivs, m))
            parts.append(lp.view(len(group), m, *lp.shape[1:]))
            if bar is not None:
                bar.update(len(group) * m)
        out.append(torch.cat(parts, 1))
    return torch.cat(out)


def activation_grads(subject: Subject, tokens: Int[Tensor, "batch n_tokens"], names: list[str], metric,
                     rows: int, bar=None) -> tuple[Tensor, Tensor, dict[str, Tensor], dict[str, Tensor]]:  # fmt: skip
    """One pass with gradients on ``tokens``, ``rows`` contexts at a time: ``(log_probs [batch, H, d], each
    context's ``metric(log_probs, tokens)`` [batch], {name: the activation}, {name: d metric / d activation})``
    for the hooks ``names``, each context's metric differentiated with respect to its own activations (the
    gradient of their sum; every activation is read where it is, so it is the total derivative through every
    later layer). What attribution patching multiplies by a change of the activation. The results are filled
    in part by part (no second copy of them at the end)."""
    n = len(tokens)
    lps = values = None
    acts: dict[str, Tensor] = {}
    grads: dict[str, Tensor] = {}
    for first in range(0, n, even_parts(n, rows)):
        part = slice(first, min(first + even_parts(n, rows), n))
        store: dict = {}
        hooks = [(name, lambda act, hook=None: act.detach().requires_grad_(True))
                 for name in ("hook_embed", "hook_pos_embed") if name in subject.model.hook_dict]  # fmt: skip
        hooks += [Intervention(name, "record", store=store).fwd_hook() for name in names]
        with torch.enable_grad():
            lp = subject.log_probs(tokens[part], hooks)
            value = metric(lp, tokens[part])
            found = [name for name in names if name in store and store[name].requires_grad]
            got = torch.autograd.grad(value.sum(), [store[k] for k in found], allow_unused=True) if found else []
        by_name = dict(zip(found, got))
        if lps is None:
            lps, values = lp.new_empty((n, *lp.shape[1:])), value.new_empty(n)
        lps[part], values[part] = lp.detach(), value.detach()
        for name in names:
            if name not in store:
                raise ValueError(f"the forward pass never reached {name}")
            act, grad = store[name].detach(), by_name.get(name)
            if name not in acts:
                acts[name], grads[name] = act.new_empty((n, *act.shape[1:])), act.new_empty((n, *act.shape[1:]))
            acts[name][part] = act
            grads[name][part] = 0 if grad is None else grad
        del store, lp, value, got, by_name
        if bar is not None:
            bar.update(part.stop - part.start)
    return lps, values, acts, grads
