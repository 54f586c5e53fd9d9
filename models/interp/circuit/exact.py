"""Exact edge patching (ACDC's edge ablation): each edge ablated alone, the rest clean, the metric's change
per context. Runs on a ``Runner``'s forward pass; the same numbers as ``runner.run_values([edge]) -
runner.clean_values`` edge by edge (a test checks it), in far fewer passes."""

from __future__ import annotations

import torch

from models.interp.circuit.graph import Edge
from models.interp.circuit.runner import Runner, batches
from models.interp.circuit.scores import EdgeScores
from models.interp.interventions import Intervention


def exact_scores(runner: Runner, edges=None, progress=None) -> EdgeScores:
    """Each edge of ``edges`` (default: every edge of the graph) ablated alone (the rest clean), per
    context: the metric's change, ``[edge, batch]``. The edge's receiver is recomputed from its edited input
    in one pass and patched into the next. One edit serves every edge it can: a sender's change at a site,
    at every position, for every position-wise receiver reading that site (each patched at its edge's
    positions only); the copyers, which read every position, need one edit per group of positions.
    ``progress`` wraps the list of passes (a progress bar)."""
    edges = runner.graph.edges if edges is None else list(edges)
    by_edit: dict = {}  # (sender, site, group or None for every position) -> the edges it serves; None: output
    for i, e in enumerate(edges):
        by_edit.setdefault(_edit_of(runner, e), []).append(i)
    out = torch.empty(len(edges), len(runner.tokens), dtype=torch.float64)
    parts = batches(list(by_edit), runner.copies)
    for part in parts if progress is None else progress(parts):
        acts = _edited(runner, [k for k in part if k is not None])
        for chunk in batches([i for k in part for i in by_edit[k]], runner.copies):
            lp = runner.forward([[_ablation(runner, edges[i], acts)] for i in chunk])
            out[chunk] = runner.values_of(lp, len(chunk)) - runner.clean_values
    return EdgeScores(edges, out)


def _edit_of(runner: Runner, e: Edge) -> tuple | None:
    """The edit ``(sender, site, group or None)`` whose pass gives ``e``'s receiver its edited activation;
    None for an edge into the output (its input is moved directly)."""
    r = runner.graph.receiver_of(e)
    return None if r.capture is None else (e.sender, r.site, None if r.positionwise else e.group)


def _edited(runner: Runner, edits: list[tuple]) -> dict:
    """For each edit ``(sender, site, group)``, in one pass: the activations of the receivers reading
    ``site`` when the sender's write there carries its ablated value (at ``group``'s positions),
    ``{edit: {capture: [batch, ...]}}``."""
    if not edits:
        return {}
    b, sites = len(runner.tokens), {site for _, site, _ in edits}
    captures = {r.capture for r in runner.graph.receivers if r.capture and r.site in sites}
    rec = runner.forward([[Intervention(site, "add", value=runner.change(s, site, runner.clean, g))]
                          for s, site, g in edits], record=captures)  # fmt: skip
    return {k: {c: rec[c][i * b : (i + 1) * b] for c in captures} for i, k in enumerate(edits)}


def _ablation(runner: Runner, e: Edge, acts: dict) -> Intervention:
    """Edge ``e`` ablated alone: its receiver's activation recomputed from its edited input (``acts``),
    at the edge's positions for a position-wise receiver; for the output, its input moved."""
    r = runner.graph.receiver_of(e)
    if r.capture is None:
        return Intervention(r.site, "add", value=runner.change(e.sender, r.site, runner.clean, e.group))
    return Intervention(r.capture, "patch", heads=None if r.head is None else (r.head,),
                        positions=runner.graph.groups[r.site][e.group] if r.positionwise else None,
                        value=acts[_edit_of(runner, e)][r.capture])  # fmt: skip
