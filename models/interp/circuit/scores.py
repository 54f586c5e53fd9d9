"""Edge scores as one object (``EdgeScores``: each edge's score on each context, keyed by edge), the
statistics on them (``mean_se``, ``ratio_se``, ``roc_auc``), what a circuit keeps (``faithfulness``,
``restored``, ``area``) and the searches' primitives that choose a circuit from them (``top_n``,
``threshold``; ``greedy``, ACDC's pruning, from the runs themselves). A score mapping is ``{Edge: float}``,
in the graph's order."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import asdict, dataclass, field

from jaxtyping import Float
from torch import Tensor

from models.interp.circuit.graph import Edge
from models.interp.circuit.runner import Runner


@dataclass(frozen=True, eq=False)
class EdgeScores(Mapping):
    """Each edge's score on each context: ``values[i]`` (``[batch]``) is edge ``edges[i]``'s; as a mapping,
    ``scores[edge]`` is that row, in the order of ``edges``. ``means()`` and ``with_se()`` average over the
    contexts."""

    edges: tuple[Edge, ...]
    values: Float[Tensor, "edge batch"]
    _index: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "edges", tuple(self.edges))
        if len(self.values) != len(self.edges):
            raise ValueError(f"EdgeScores: {len(self.values)} rows of values for {len(self.edges)} edges")
        object.__setattr__(self, "_index", {e: i for i, e in enumerate(self.edges)})

    def __getitem__(self, edge: Edge) -> Float[Tensor, " batch"]:
        return self.values[self._index[edge]]

    def __iter__(self) -> Iterator[Edge]:
        return iter(self.edges)

    def __len__(self) -> int:
        return len(self.edges)

    def means(self) -> dict[Edge, float]:
        """Each edge's score averaged over the contexts."""
        return dict(zip(self.edges, self.values.mean(1).tolist()))

    def with_se(self) -> dict[Edge, tuple[float, float]]:
        """Each edge's mean score over the contexts and its standard error (``mean_se``)."""
        return {e: mean_se(v) for e, v in zip(self.edges, self.values)}


def roc_auc(scores: Mapping[Edge, float], truth: Collection[Edge]) -> float:
    """ROC AUC of ``scores`` (higher: more likely an edge of the circuit) against the circuit's edges
    ``truth``; ties count half."""
    truth = set(truth)
    pos = [s for e, s in scores.items() if e in truth]
    neg = [s for e, s in scores.items() if e not in truth]
    if not pos or not neg:
        raise ValueError(f"ROC AUC needs true and false edges, got {len(pos)} true and {len(neg)} false")
    wins = sum((p > q) + 0.5 * (p == q) for p in pos for q in neg)
    return wins / (len(pos) * len(neg))


def ratio_se(a: Float[Tensor, " n"], b: Float[Tensor, " n"]) -> tuple[float, float]:
    """``mean(a) / mean(b)`` and its standard error over the n contexts: the delta method on the pairs
    ``(a_i, b_i)`` of one context each, so the denominator's variance and its covariance with the numerator
    count (it equals a bootstrap over contexts; a test checks it)."""
    a, b = a.double(), b.double()
    r = a.mean() / b.mean()
    se = ((a - r * b).std() / (len(a) ** 0.5) / b.mean().abs()).item() if len(a) > 1 else float("nan")
    return r.item(), se


def mean_se(x: Float[Tensor, " n"]) -> tuple[float, float]:
    """The mean of ``x`` and its standard error over the n contexts."""
    x = x.double()
    return x.mean().item(), (x.std() / len(x) ** 0.5).item() if len(x) > 1 else float("nan")


def beyond_2se(mean: float, se: float, floor: float = 0.0) -> bool:
    """A share's denominator is worth dividing by: its ``mean`` beyond 2 standard errors ``se`` of zero,
    positive, and above ``floor`` (float rounding, where the caller has one)."""
    return mean > 2 * se and mean > floor


# What a circuit keeps ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class CurvePoint:
    """A circuit of ``n_edges`` edges: the share ``faithfulness`` (with its standard error ``se``) it keeps or
    recovers, and the mean metric ``nll`` of its run."""

    n_edges: int
    faithfulness: float
    se: float
    nll: float

    def to_dict(self) -> dict:
        return asdict(self)


def faithfulness(runner: Runner, kept, plateau: Tensor, full: Tensor) -> CurvePoint:
    """Share of the full model's progress (``plateau - full``, per context ``[batch]``) the circuit ``kept``
    keeps with every other edge ablated, with its standard error."""
    values = runner.keep_only_values(kept)
    share, se = ratio_se(plateau - values, plateau - full)
    return CurvePoint(len(kept), share, se, values.mean().item())


def restored(denoiser: Runner, kept, clean: Tensor) -> CurvePoint:
    """Denoising faithfulness: the share of the clean-minus-corrupted metric (``clean``: the clean run's,
    ``[batch]``) that the corrupted run recovers with only the edges ``kept`` restored to their clean
    values, with its standard error."""
    values = denoiser.run_values(kept)
    share, se = ratio_se(denoiser.clean_values - values, denoiser.clean_values - clean)
    return CurvePoint(len(kept), share, se, values.mean().item())


def area(curve: list[CurvePoint], n_total: int) -> float:
    """Area under a faithfulness curve over the fraction of edges kept (trapezoids)."""
    xs = [c.n_edges / n_total for c in curve]
    return sum((xs[i + 1] - xs[i]) * (curve[i + 1].faithfulness + curve[i].faithfulness) / 2
               for i in range(len(curve) - 1))  # fmt: skip


def kl_to_full(runner: Runner, kept, full_lp: Tensor) -> tuple[float, float]:
    """KL(full model || circuit ``kept``) of the predictions of x_1..x_{H-1} (``full_lp``: the full model's
    log-probs ``[batch, H, d]``), mean and SE over contexts."""
    kept = set(kept)
    lp = runner.run_log_probs([e for e in runner.graph.edges if e not in kept]).double()
    kl = (full_lp.exp() * (full_lp - lp)).sum(-1)[:, 1:].mean(-1)
    return mean_se(kl)


# Search -------------------------------------------------------------------------------------------------
def top_n(scores: Mapping[Edge, float], n: int) -> list[Edge]:
    """The ``n`` edges of largest |score| (ties in the mapping's order)."""
    return sorted(scores, key=lambda e: -abs(scores[e]))[:n]


def curve_sizes(n_total: int, points: int) -> list[int]:
    """Circuit sizes along a faithfulness curve: 0, then ``points`` sizes spaced geometrically up to every edge."""
    sizes = {0, n_total}
    for i in range(1, points + 1):
        sizes.add(max(1, round(n_total ** (i / points))))
    return sorted(sizes)


def threshold(scores: Mapping[Edge, float], tau: float) -> list[Edge]:
    """The edges with |score| >= ``tau``, in the mapping's order."""
    return [e for e, s in scores.items() if abs(s) >= tau]


def greedy(runner: Runner, tau: float, order=None) -> list[Edge]:
    """ACDC-style pruning: from the full graph, visit receivers from the output backwards and remove each
    edge whose removal (with those already removed) moves the metric by less than ``tau``."""
    removed: list[Edge] = []
    current = runner.clean_metric
    levels = {(r.node, r.input): r.level for r in runner.graph.receivers}
    edges = order or sorted(runner.graph.edges, key=lambda e: -levels[(e.receiver, e.input)])
    for e in edges:
        value = runner.run(removed + [e])
        if abs(value - current) < tau:
            removed.append(e)
            current = value
    gone = set(removed)
    return [e for e in runner.graph.edges if e not in gone]
