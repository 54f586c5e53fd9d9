"""The exact edge patching and the keep-only run that ``models.interp.circuit`` replaced (2026-12-02), kept as the
baseline ``python -m bench --only circuit`` measures them against. Same estimator, same numbers (the bench
prints the largest difference); what differs is the work:

- ``exact_values_per_edge``: every edge gets its own copy of the contexts in a capture pass (its sender's
  change at its receiver's site, at its positions; the whole forward pass runs) and another in a patch
  pass, 16 edges (2048 rows at 128 contexts) per pass;
- ``keep_only_values_per_receiver``: every receiver with an ablated edge gets its own copy in a full
  capture pass, and the senders' writes are re-read by a full pass before each level.

``models.interp.circuit`` shares one edit among every edge of a sender at a site, ends capture passes once the
receivers are recorded, shares copies among receivers with the same ablated edges, and keeps passes near
512 rows (a larger batch spends its time faulting in fresh memory).
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from models.interp.circuit import Runner, sender_writes
from models.interp.interventions import Intervention


def _captured(runner: Runner, receivers, deltas, injections=()) -> list[Tensor]:
    """Each receiver's activation with its own delta at its site, one full pass, one copy per receiver."""
    b, n = len(runner.tokens), len(receivers)
    store: dict = {}
    hooks = [(iv.hook, lambda a, hook, iv=iv: torch.cat([iv.apply(a[c * b : (c + 1) * b]) for c in range(n)]))
             for iv in injections]  # fmt: skip
    for site in {r.site for r in receivers}:
        big = torch.cat([d if r.site == site else torch.zeros_like(d) for r, d in zip(receivers, deltas)])
        hooks.append((site, lambda a, hook, big=big: a + big))
    hooks += [Intervention(c, "record", store=store).fwd_hook() for c in {r.capture for r in receivers}]
    with torch.no_grad():
        runner.subject.log_probs(runner.tokens.repeat(n, 1), hooks)
    return [store[r.capture][c * b : (c + 1) * b].clone() for c, r in enumerate(receivers)]


def exact_values_per_edge(runner: Runner, edges, chunk: int = 16) -> Float[Tensor, "edge batch"]:
    """``exact_scores(runner, edges).values`` as it was computed: one capture copy and one patch copy per edge."""
    out = []
    for part in [edges[i : i + chunk] for i in range(0, len(edges), chunk)]:
        rs = [runner.graph.receiver_of(e) for e in part]
        deltas = [runner.delta(r, [e], runner.clean) for r, e in zip(rs, part)]
        inner = [c for c, r in enumerate(rs) if r.capture is not None]
        acts = dict(zip(inner, _captured(runner, [rs[c] for c in inner], [deltas[c] for c in inner]))) if inner else {}
        copies = [[Intervention(r.site, "add", value=deltas[c])] if r.capture is None else
                  [Intervention(r.capture, "patch", heads=None if r.head is None else (r.head,), value=acts[c])]
                  for c, r in enumerate(rs)]  # fmt: skip
        out.append(runner.values_of(runner.forward(copies), len(part)) - runner.clean_values)
    return torch.cat(out)


def keep_only_values_per_receiver(runner: Runner, kept) -> Float[Tensor, " batch"]:
    """``runner.keep_only_values(kept)`` as it was computed: a full pass for the senders' writes before
    each level and a full capture pass with one copy per receiver."""
    kept, by_receiver = set(kept), {}
    for e in runner.graph.edges:
        if e not in kept:
            by_receiver.setdefault(runner.graph.receiver_of(e), []).append(e)
    injections, final, now = [], [], runner.clean
    for level in sorted({r.level for r in by_receiver}):
        todo = [r for r in by_receiver if r.level == level]
        if injections:
            now = sender_writes(runner.subject, runner.graph, runner.tokens, [iv.fwd_hook() for iv in injections])[0]
        deltas = [runner.delta(r, by_receiver[r], now) for r in todo]
        if todo[0].capture is None:
            final = [Intervention(r.site, "add", value=d) for r, d in zip(todo, deltas)]
            continue
        injections = injections + [Intervention(r.capture, "patch", heads=None if r.head is None else (r.head,), value=a)
                                   for r, a in zip(todo, _captured(runner, todo, deltas, injections))]  # fmt: skip
    return runner.values_of(runner.forward([final], injections), 1)[0]
