"""Node ablation: a circuit of nodes, every head and MLP outside it set to its mean over held-out contexts
(``mean``) or its value on a fresh context of the task (``resample``), at every position (or at given
positions): the circuit's sufficiency, which does not depend on a corruption that keeps part of the
context. Runs the subject itself, not a ``Runner`` (no edge is ablated)."""

from __future__ import annotations

from functools import partial

import torch
from jaxtyping import Float
from torch import Tensor

from models.interp.circuit.graph import Graph, Node, check_hooks
from models.interp.circuit.runner import ROWS, Metric, batches, run_copies
from models.interp.interventions import Intervention
from models.interp.subject import Subject
from probes.metrics import per_context_nll

NODE_ABLATIONS = {
    "mean": "its mean over held-out contexts, position by position",
    "resample": "its value on a fresh context of the task, context by context",
}


def node_outputs(subject: Subject, graph: Graph) -> dict[Node, tuple[str, int | None]]:
    """Each head and MLP of ``graph`` -> (the hook of its output, its head index or None): ``hook_z`` of
    its layer for a head, ``hook_mlp_out`` for an MLP."""
    out = {}
    for n in graph.nodes(graph.edges):
        mlp = n.kind == "mlp"
        out[n] = (f"blocks.{n.layer}.hook_mlp_out", None) if mlp else (subject.head_output(n.layer), n.head)
    check_hooks(subject, output_hooks(out))
    return out


def output_hooks(outputs: dict[Node, tuple[str, int | None]]) -> list[str]:
    """The hooks of ``node_outputs``, each once, sorted."""
    return sorted({h for h, _ in outputs.values()})


def record_outputs(subject: Subject, tokens, hooks_: list[str], rows: int = ROWS) -> dict:
    """The activations at ``hooks_`` on ``tokens``, ``{hook: [batch, ...]}``, ``rows`` contexts a pass."""
    return run_and_record(subject, tokens, hooks_, None, rows)[0]


def mean_outputs(subject: Subject, tokens, hooks_: list[str], rows: int = ROWS, progress=None) -> dict:
    """The activations at ``hooks_`` averaged over ``tokens``, ``{hook: [1, ...]}``: summed in float64 a part of
    ``rows`` contexts at a time, so that memory is one part's, whatever the number of contexts (what mean
    ablation reads: ``node_ablated_values`` and ``node_costs`` take it as ``recorded``, the mean of one row
    being itself). ``progress`` wraps the list of parts (a progress bar)."""
    sums: dict = {}
    starts = range(0, len(tokens), rows)
    for i in starts if progress is None else progress(starts):
        store: dict = {}
        with torch.no_grad():
            subject.log_probs(tokens[i : i + rows], [Intervention(h, "record", store=store).fwd_hook() for h in hooks_])
        for h in hooks_:
            part = store[h].double().sum(0, keepdim=True)
            sums[h] = (part, store[h].dtype) if h not in sums else (sums[h][0] + part, sums[h][1])
    return {h: (total / len(tokens)).to(dtype) for h, (total, dtype) in sums.items()}


def run_and_record(subject: Subject, tokens, hooks_: list[str], metric: Metric | None,
                   rows: int = ROWS) -> tuple[dict, Float[Tensor, " batch"] | None]:  # fmt: skip
    """``record_outputs`` and, in the same passes, the clean run's ``metric`` per context (None without one)."""
    out: dict = {}  # filled part by part: a big model's outputs are gigabytes, not to be held twice
    values = []
    for i in range(0, len(tokens), rows):
        store: dict = {}
        with torch.no_grad():
            lp = subject.log_probs(tokens[i : i + rows], [Intervention(h, "record", store=store).fwd_hook() for h in hooks_])
        for h in hooks_:
            part = store[h].detach()
            if h not in out:
                out[h] = part.new_empty((len(tokens), *part.shape[1:]))
            out[h][i : i + len(part)] = part
        if metric is not None:
            values.append(metric(lp, tokens[i : i + rows]))
    return out, torch.cat(values) if values else None


def output_grads(subject: Subject, graph: Graph, tokens, metric: Metric) -> tuple[dict, dict]:
    """The clean run's node outputs on ``tokens`` and the metric's gradient there, ``({hook: [batch, ...]},
    {hook: [batch, ...]})`` at the hooks of ``node_outputs``: each context's metric differentiated with
    respect to its own outputs (their sum's gradient). One forward and one backward pass."""
    hooks_, acts = output_hooks(node_outputs(subject, graph)), {}

    def leaf(x, hook):  # the inputs: every activation after them is differentiable
        return x.detach().requires_grad_(True)

    def keep(x, hook, name):  # in the graph, not cut from it: its gradient is the total derivative, every path
        acts[name] = x  # through the later heads and MLPs included (a leaf here would leave the direct path only)
        return x

    hooks = [(s, leaf) for s in ("hook_embed", "hook_pos_embed") if s in subject.model.hook_dict]
    hooks += [(h, partial(keep, name=h)) for h in hooks_]
    with torch.enable_grad():
        total = metric(subject.log_probs(tokens, hooks), tokens).sum()
        grads = torch.autograd.grad(total, [acts[h] for h in hooks_], allow_unused=True)
    return ({h: acts[h].detach() for h in hooks_},
            {h: torch.zeros_like(acts[h]) if g is None else g for h, g in zip(hooks_, grads)})  # fmt: skip


def node_attribution(subject: Subject, graph: Graph, clean: dict, grads: dict, value: dict,
                     ) -> dict[Node, Float[Tensor, " batch"]]:  # fmt: skip
    """Per head and MLP, per context: the first-order change of the metric when that node alone is set to
    ``value`` (``{hook: [batch or 1, ...]}``: a mean, or the outputs on other contexts), the rest clean:
    ``(value - clean) . d metric / d output`` over its positions and dimensions (attribution patching of
    the node; ``clean``, ``grads``: ``output_grads``)."""
    out = {}
    for n, (hook, head) in node_outputs(subject, graph).items():
        diff = value[hook].to(clean[hook].dtype) - clean[hook]
        prod = diff * grads[hook]
        out[n] = (prod if head is None else prod[:, :, head]).double().flatten(1).sum(1)
    return out


def node_ablated_values(subject: Subject, graph: Graph, tokens, kept, ablation: str, reference,
                        metric: Metric = per_context_nll, rows: int = ROWS, recorded: dict | None = None,
                        positions=None) -> Float[Tensor, " batch"]:  # fmt: skip
    """Per context, the metric with every head and MLP NOT in ``kept`` ablated at every position: set to
    its mean over the ``reference`` contexts (``mean``) or, context by context, to its value on
    ``reference[i]`` (``resample``: as many as ``tokens``). The embeddings and the output are never
    ablated. ``kept`` may name nodes outside the graph's heads and MLPs (ignored). ``recorded``: the
    outputs on ``reference`` recorded already (``record_outputs``), to spare that pass. ``positions``: ablate
    there only (default: every position)."""
    if ablation not in NODE_ABLATIONS:
        raise ValueError(f"unknown node ablation {ablation!r}; expected one of {', '.join(NODE_ABLATIONS)}")
    if ablation == "resample" and len(reference) != len(tokens):
        raise ValueError(f"resample ablation pairs contexts: {len(reference)} reference contexts for {len(tokens)}")
    by_hook = outside(subject, graph, kept)
    if ablation == "mean":  # the mean, a part at a time
        ref = recorded if recorded is not None else mean_outputs(subject, reference, sorted(by_hook), rows)
    values = []
    for i in range(0, len(tokens), rows):
        part = slice(i, i + rows)
        if ablation == "resample":  # each part's own reference contexts, recorded as they are reached
            ref = ({h: v[part] for h, v in recorded.items()} if recorded is not None
                   else record_outputs(subject, reference[part], sorted(by_hook), rows))  # fmt: skip
        ivs = outside_interventions(by_hook, ablation, ref, positions)
        with torch.no_grad():
            lp = subject.log_probs(tokens[part], [iv.fwd_hook() for iv in ivs])
        values.append(metric(lp, tokens[part]))
    return torch.cat(values)


def outside(subject: Subject, graph: Graph, kept) -> dict[str, list[int | None]]:
    """The heads and MLPs not in ``kept``, by output hook: ``{hook: [head index, or None for an MLP]}``."""
    by_hook: dict = {}
    kept = set(kept)
    for n, (hook, head) in node_outputs(subject, graph).items():
        if n not in kept:
            by_hook.setdefault(hook, []).append(head)
    return by_hook


def outside_interventions(by_hook: dict, ablation: str, ref: dict, positions=None) -> list[Intervention]:
    """The Interventions that set each head and MLP of ``by_hook`` (``outside``) to its ablated value: its mean
    over ``ref`` (``mean``: ``ref[hook]`` ``[k, ...]``, averaged here) or, context by context, ``ref[hook]``
    (``resample``: as many rows as the contexts run), at ``positions`` (default: every position)."""
    ivs = []
    for hook, heads in by_hook.items():
        index = None if heads == [None] else tuple(heads)
        if ablation == "mean":
            ivs.append(Intervention(hook, "mean", heads=index, positions=positions, value=ref[hook].mean(0)))
        else:
            ivs.append(Intervention(hook, "patch", heads=index, positions=positions, value=ref[hook]))
    return ivs


def node_costs(subject: Subject, graph: Graph, tokens, reference, metric: Metric = per_context_nll,
               rows: int = ROWS, nodes=None, positions=None, recorded: dict | None = None,
               clean: Tensor | None = None, progress=None) -> dict[Node, Float[Tensor, " batch"]]:  # fmt: skip
    """Per head and MLP (or those of ``nodes``), per context: the metric's change when that node alone is
    mean-ablated (its mean over ``reference``; at ``positions`` only, if given), the rest clean. Several
    nodes to a pass, each on its own copy of the contexts (about ``rows`` contexts a pass). ``recorded``:
    every node's output on ``reference`` recorded already (``record_outputs``), to spare that pass;
    ``clean``: the metric of the clean run on ``tokens`` ``[batch]``, if known; ``progress`` wraps the list
    of passes (a progress bar)."""
    outputs = node_outputs(subject, graph)
    if clean is None:
        with torch.no_grad():
            clean = torch.cat([metric(subject.log_probs(tokens[i : i + rows]), tokens[i : i + rows])
                               for i in range(0, len(tokens), rows)])  # fmt: skip
    if recorded is None:
        recorded = mean_outputs(subject, reference, output_hooks(outputs), rows)
    means = {hook: recorded[hook].mean(0) for hook in output_hooks(outputs)}
    todo, b = list(outputs if nodes is None else nodes), len(tokens)
    if b > rows:  # one node a pass, the contexts in parts
        return {n: node_ablated_values(subject, graph, tokens, [m for m in outputs if m != n], "mean", reference,
                                       metric, rows, recorded, positions) - clean for n in todo}  # fmt: skip
    costs = {}
    parts = batches(todo, max(1, rows // b))
    for part in parts if progress is None else progress(parts):
        copies = [[Intervention(outputs[n][0], "mean", heads=None if outputs[n][1] is None else (outputs[n][1],),
                                positions=positions, value=means[outputs[n][0]])] for n in part]  # fmt: skip
        values = metric(run_copies(subject, tokens, copies), tokens.repeat(len(part), 1)).view(len(part), b)
        costs.update({n: v - clean for n, v in zip(part, values)})
    return costs
