"""Exact edge patching (ACDC's edge ablation): each edge ablated alone, the rest clean, the metric's change
per context. Runs on a ``Runner``'s forward pass; the same numbers as ``runner.run_values([edge]) -
runner.clean_values`` edge by edge (a test checks it), in far fewer passes."""

from __future__ import annotations

import torch

from models.interp.circuit.graph import Edge, Graph
from models.interp.circuit.runner import Runner, batches
from models.interp.circuit.scores import EdgeScores
from models.interp.interventions import Intervention


def exact_scores(runner: Runner, edges=None, progress=None) -> EdgeScores:
    """Each edge of ``edges`` (default: every edge of the graph) ablated alone (the rest clean), per
    context: the metric's change, ``[edge, batch]``. The edge's receiver is recomputed from its edited input
    in one pass and patched into the next. One edit serves every edge it can: a sender's change at a site,
    at every position, for every position-wise receiver reading that site (each patched at its edge's
    positions only); the copyers, which read every position, need one edit per group of positions.
    An edge whose sender's ablated value equals its clean write at the edge's positions (the position
    embedding; the target's tokens under a corruption that keeps them) changes nothing: its score is
    exactly 0 and it takes no pass. ``progress`` wraps the list of passes (a progress bar)."""
    edges = runner.graph.edges if edges is None else list(edges)
    out = torch.zeros(len(edges), len(runner.tokens), dtype=torch.float64)
    plan = _plan(runner, edges)
    for edits, chunks in plan if progress is None else progress(plan):
        acts = _edited(runner, edits)
        for chunk in chunks:
            lp = runner.forward([[_ablation(runner, edges[i], acts)] for i in chunk])
            out[chunk] = runner.values_of(lp, len(chunk)) - runner.clean_values
    return EdgeScores(edges, out)


def changing(runner: Runner, edges: list[Edge]) -> list[int]:
    """The indices of ``edges`` whose sender's ablated value differs from its clean write somewhere at the
    edge's positions, on some context (the others score exactly 0)."""
    moved: dict = {}
    for e in edges:
        key = (e.sender, runner.graph.receiver_of(e).site, e.group)
        if key not in moved:
            moved[key] = bool(runner.change(*key[:2], runner.clean, key[2]).any())
    return [i for i, e in enumerate(edges) if moved[(e.sender, runner.graph.receiver_of(e).site, e.group)]]


def _plan(runner: Runner, edges: list[Edge]) -> list[tuple[list[tuple], list[list[int]]]]:
    """The passes of ``exact_scores``: per batch of ``runner.copies`` edits, the edits (one edited pass) and
    the indices of the edges they serve in batches of ``runner.copies`` (one patched pass each)."""
    by_edit: dict = {}  # (sender, site, group or None for every position) -> the edges it serves; None: output
    for i in changing(runner, edges):
        by_edit.setdefault(_edit_of(runner.graph, edges[i]), []).append(i)
    return [([k for k in part if k is not None], batches([i for k in part for i in by_edit[k]], runner.copies))
            for part in batches(list(by_edit), runner.copies)]  # fmt: skip


def copy_runs(graph: Graph) -> int:
    """At most how many runs of the contexts ``exact_scores`` makes on ``graph``'s edges (copies, several to
    a pass): one per edit (a sender at a site, or at a group of positions for the copyers), one per edge."""
    return len({_edit_of(graph, e) for e in graph.edges} - {None}) + len(graph.edges)


def _edit_of(graph: Graph, e: Edge) -> tuple | None:
    """The edit ``(sender, site, group or None)`` whose pass gives ``e``'s receiver its edited activation;
    None for an edge into the output (its input is moved directly)."""
    r = graph.receiver_of(e)
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
                        value=acts[_edit_of(runner.graph, e)][r.capture])  # fmt: skip
