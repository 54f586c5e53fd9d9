"""Searches: how a circuit is chosen from one corruption's edge scores. Each is one ``Search`` in
``SEARCHES`` (``register_search`` adds one): the smallest top-n that keeps a share of the progress, a score
threshold, or ACDC's greedy pruning. ``among`` and ``ranked`` give the edges a search may keep and their
order."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from models.interp.circuit.registry import Registry

if TYPE_CHECKING:  # the registry itself loads no torch: the command line's --help lists it before torch loads
    from torch import Tensor

    from models.interp.circuit.graph import Edge, Graph
    from models.interp.circuit.runner import Runner

DEFAULT_THRESHOLD = 1e-3  # threshold and greedy without a config.threshold: |score| (nats) an edge must reach


@dataclass(frozen=True)
class Search:
    """One way to choose the circuit: ``choose(runner, scores, order, config, plateau, full)`` -> its edges.
    ``scores``: ``{edge: mean score}`` of the edges it may keep; ``order``: those edges, most important first
    (``ranked``); ``config``: a ``CircuitConfig``; ``plateau``, ``full``: per-context metrics ``[batch]`` of
    the plateau and of the full model on the runner's contexts (for a search that measures faithfulness)."""

    name: str
    words: str
    choose: Callable[..., list[Edge]]


SEARCHES: Registry[Search] = Registry("search")
register_search = SEARCHES.register


def _top_n(runner: Runner, scores: dict, order: list[Edge], config, plateau: Tensor, full: Tensor) -> list[Edge]:
    """``config.n_edges`` of ``order``, else its smallest prefix keeping ``config.target`` of the progress
    (bisection: faithfulness grows with the prefix, nearly)."""
    from models.interp.circuit.scores import faithfulness

    if config.n_edges is not None:
        return order[: config.n_edges]
    lo, hi = 0, len(order)
    while lo < hi:
        mid = (lo + hi) // 2
        if faithfulness(runner, order[:mid], plateau, full).faithfulness >= config.target:
            hi = mid
        else:
            lo = mid + 1
    return order[:lo]


def _tau(config) -> float:
    return config.threshold if config.threshold is not None else DEFAULT_THRESHOLD


register_search(Search("top-n", "the fewest top edges by |score| that keep the target share", _top_n))
def _threshold(runner: Runner, scores: dict, order: list[Edge], config, *_) -> list[Edge]:
    from models.interp.circuit.scores import threshold

    return threshold(scores, _tau(config))


def _greedy(runner: Runner, scores: dict, order: list[Edge], config, *_) -> list[Edge]:
    from models.interp.circuit.scores import greedy

    return greedy(runner, _tau(config))


register_search(Search("threshold", "every edge whose |score| reaches the threshold", _threshold))
register_search(Search("greedy", "ACDC's greedy pruning from the output backwards", _greedy))


def among(graph: Graph, nodes) -> list[Edge]:
    """Every edge between ``nodes`` (heads and MLPs, as ``Node`` or label), the embeddings and the output."""
    from models.interp.circuit.graph import Node

    keep = {Node.parse(n) for n in nodes} | {n for n in graph.node_order if n.is_end}
    return [e for e in graph.edges if e.sender in keep and e.receiver in keep]


def ranked(stats: dict, min_z: float) -> list[Edge]:
    """The edges of ``stats`` (``{edge: (score, se)}``), those whose |score| exceeds ``min_z`` standard errors
    first, each part by |score| descending."""
    return sorted(stats, key=lambda e: (not abs(stats[e][0]) > min_z * stats[e][1], -abs(stats[e][0])))
