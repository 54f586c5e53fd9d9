"""Attribution patching: EAP (the gradient at the clean run times the sender's change, first order in the
change) and EAP-IG (the gradient integrated along the inputs from clean to ablated). Runs on a ``Runner``'s
contexts, senders and metric."""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from models.interp.circuit.runner import Runner
from models.interp.circuit.scores import EdgeScores
from models.interp.interventions import Intervention


def input_grads(runner: Runner, fwd_hooks=(), edges=None) -> dict:
    """d metric / d (each receiver's input), ``{(node, input): [batch, pos, D]}``, at the run under
    ``fwd_hooks``: the gradient at the receiver's captured activation pulled back to its site. Each
    context's metric is differentiated with respect to its own inputs (their sum's gradient). ``edges``:
    only the receivers these edges enter (default: every receiver)."""
    sites, acts = {}, {}
    wanted = None if edges is None else {(e.receiver, e.input) for e in edges}
    receivers = [r for r in runner.graph.receivers if wanted is None or (r.node, r.input) in wanted]
    captures = {r.capture for r in receivers if r.capture}

    def leaf(x, hook):
        return x.detach().requires_grad_(True)

    hooks = [*fwd_hooks]
    hooks += [(s, leaf) for s in ("hook_embed", "hook_pos_embed") if s in runner.subject.model.hook_dict]
    hooks += [Intervention(s, "record", store=sites).fwd_hook() for s in {r.site for r in receivers}]
    hooks += [Intervention(c, "record", store=acts).fwd_hook() for c in captures]
    with torch.enable_grad():
        lp = runner.subject.log_probs(runner.tokens, hooks)
        m = runner.metric(lp, runner.targets).sum()
        names = sorted(captures)
        final = [r.site for r in receivers if r.capture is None]
        grads = torch.autograd.grad(m, [acts[c] for c in names] + [sites[s] for s in final], retain_graph=True,
                                    allow_unused=True)  # fmt: skip
        g_act = dict(zip(names, grads[: len(names)]))
        out = {}
        for r in receivers:
            if r.capture is None:
                out[(r.node, r.input)] = grads[len(names) + final.index(r.site)]
                continue
            g = g_act[r.capture]
            if g is None:
                out[(r.node, r.input)] = torch.zeros_like(sites[r.site])
                continue
            a = acts[r.capture]
            if r.head is not None:
                sel = torch.zeros_like(g)
                sel[:, :, r.head] = g[:, :, r.head]
                g = sel
            (pulled,) = torch.autograd.grad(a, sites[r.site], grad_outputs=g, retain_graph=True, allow_unused=True)
            out[(r.node, r.input)] = torch.zeros_like(sites[r.site]) if pulled is None else pulled
    runner.passes += 1
    runner.context_runs += len(runner.tokens)
    return {k: v.detach() for k, v in out.items()}


def attribution(runner: Runner, grads: dict, edges) -> EdgeScores:
    """Per edge and context: the sender's change at the edge's positions times the gradient there."""
    out: list[Float[Tensor, " batch"]] = []
    for e in edges:
        site = runner.graph.receiver_of(e).site
        diff = runner.change(e.sender, site, runner.clean, e.group)
        out.append((diff.double() * grads[(e.receiver, e.input)].double()).flatten(1).sum(1))
    return EdgeScores(edges, torch.stack(out) if out else torch.empty(0, len(runner.tokens), dtype=torch.float64))


def eap_scores(runner: Runner, edges=None) -> EdgeScores:
    """EAP, per edge of ``edges`` (default: every edge) and context, ``[edge, batch]``: ``(ablated - clean
    write) . d metric / d input`` at the clean run (first order in the change)."""
    edges = runner.graph.edges if edges is None else edges
    return attribution(runner, input_grads(runner), edges)


def eap_ig_scores(runner: Runner, edges=None, steps: int = 8, progress=None) -> EdgeScores:
    """EAP-IG, per edge and context, ``[edge, batch]``: the gradient averaged over ``steps`` runs whose
    embeddings move from clean to ablated (midpoints ``(i + 1/2) / steps``), times the change: integrated
    gradients along the inputs."""
    edges = runner.graph.edges if edges is None else edges
    embeds = [s for s in runner.graph.senders if s.node.kind in ("embed", "pos_embed")]
    total = None
    for i in range(steps) if progress is None else progress(range(steps)):
        a = (i + 0.5) / steps
        hooks = []
        for s in embeds:
            hook = s.at[next(iter(s.at))][0]
            if hook not in ("hook_embed", "hook_pos_embed"):
                continue
            site = next(k for k, v in s.at.items() if v[0] == hook)
            diff = runner.source[(s.node, site)] - runner.clean[(s.node, site)]
            hooks.append(Intervention(hook, "add", value=a * diff).fwd_hook())
        g = input_grads(runner, hooks)
        total = g if total is None else {k: total[k] + g[k] for k in total}
    return attribution(runner, {k: v / steps for k, v in total.items()}, edges)
