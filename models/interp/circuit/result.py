"""What ``discover`` returns: ``CircuitResult`` and the typed pieces it is made of. ``to_dict()`` gives the
JSON that ``python -m analyses.circuit`` writes (``figures/circuit.json``'s ``results``): nodes and edges as
their labels, each estimate as its value and standard error."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import NamedTuple

from models.interp.circuit.config import CircuitConfig
from models.interp.circuit.corruptions import CORRUPTIONS
from models.interp.circuit.graph import Edge, Node
from models.interp.circuit.nodes import NODE_ABLATIONS
from models.interp.circuit.report import COMPUTES
from models.interp.circuit.scores import CurvePoint

METRIC = "target NLL (nats, x_1..x_{H-1})"


class Estimate(NamedTuple):
    """A mean over contexts (or a ratio of two) and its standard error."""

    value: float
    se: float


@dataclass(frozen=True)
class ScoredEdge:
    """An edge and its score (the metric's change when it alone is ablated, or restored when denoising),
    mean and standard error over the search contexts."""

    edge: Edge
    score: float
    se: float

    def to_dict(self) -> dict:
        return {**self.edge.to_dict(), "score": self.score, "se": self.se}


@dataclass(frozen=True)
class KeptEdge(ScoredEdge):
    """An edge of the circuit: its score under ``scored_by`` (the first corruption whose circuit kept it)
    and the corruptions whose circuits kept it (``found_by``)."""

    scored_by: str = ""
    found_by: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {**super().to_dict(), "scored_by": self.scored_by, "found_by": list(self.found_by)}


@dataclass(frozen=True)
class InputSum:
    """The summed score of every edge into one input (``input``) of a layer's heads (``receivers``: ``L1``)
    or of one other receiver (``MLP0``, ``output``) at one group of positions, with its standard error over
    the contexts (a sum of single-edge effects, not the effect of ablating them together)."""

    receivers: str
    input: str
    group: str
    n_edges: int
    sum: float
    se: float

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Denoising:
    """A circuit found by denoising, judged by denoising: the share of the clean-minus-corrupted metric it
    recovers restored alone in the corrupted run (``faithfulness``), along the curve too; ``cost``: that
    clean-minus-corrupted metric itself, the share's denominator."""

    curve: list[CurvePoint]
    curve_area: float
    faithfulness: Estimate
    cost: Estimate


@dataclass(frozen=True)
class CorruptionSearch:
    """The circuit one corruption's scores choose: its ``edges`` (by |score|), how many of them are within
    2 SE of zero, how many edges of the whole graph are beyond ``min_z`` SE, the share of the progress they
    keep on the search contexts, the faithfulness curve of the top-n edges of the whole graph and its area,
    every edge's score, the summed scores per input; ``denoising`` and ``kl_to_full`` where measured."""

    corruption: str
    edges: list[ScoredEdge]
    n_within_2se: int
    n_beyond_min_z: int
    faithfulness: Estimate
    curve: list[CurvePoint]
    curve_area: float | None  # None: no curve (a circuit of nodes)
    all_edges: list[ScoredEdge]
    by_input: list[InputSum]
    denoising: Denoising | None = None
    kl_to_full: Estimate | None = None

    def to_dict(self) -> dict:
        c = CORRUPTIONS[self.corruption]
        out = {
            "corruption": c.words, "means": c.means, "edges": [e.to_dict() for e in self.edges],
            "n_within_2se": self.n_within_2se, "n_beyond_min_z": self.n_beyond_min_z,
            "faithfulness": self.faithfulness.value, "faithfulness_se": self.faithfulness.se,
            "curve": [p.to_dict() for p in self.curve], "curve_area": self.curve_area,
            "all_edges": [e.to_dict() for e in self.all_edges], "by_input": [x.to_dict() for x in self.by_input],
        }  # fmt: skip
        if self.denoising is not None:
            d = self.denoising
            out.update(denoising_curve=[p.to_dict() for p in d.curve], denoising_curve_area=d.curve_area,
                       denoising_faithfulness=d.faithfulness.value, denoising_faithfulness_se=d.faithfulness.se,
                       denoising_cost=d.cost.value, denoising_cost_se=d.cost.se)  # fmt: skip
        if self.kl_to_full is not None:
            out.update(kl_to_full=self.kl_to_full.value, kl_to_full_se=self.kl_to_full.se)
        return out


@dataclass(frozen=True)
class Measurement:
    """The circuit's answers on one sample of contexts: the model's ``progress`` and mean ``nll``, the
    share of the progress the circuit's edges keep under each corruption (``faithfulness[name]``), and the
    share its nodes keep with every other head and MLP ablated (``sufficiency["mean"]``, ``["resample"]``)."""

    n_contexts: int
    faithfulness: dict[str, Estimate]
    progress: Estimate
    nll: float
    sufficiency: dict[str, Estimate]

    def to_dict(self) -> dict:
        out: dict = {"n_contexts": self.n_contexts}
        for c, (share, se) in self.faithfulness.items():
            out[f"faithfulness_{c}"], out[f"faithfulness_{c}_se"] = share, se
        out.update(progress=self.progress.value, progress_se=self.progress.se, nll=self.nll)
        for a, (share, se) in self.sufficiency.items():
            out[f"sufficiency_{a}"], out[f"sufficiency_{a}_se"] = share, se
        return out


@dataclass(frozen=True)
class NodeRole:
    """One node of the circuit: the corruptions whose circuits need it, where it reads and writes (per
    corruption, ``input@group`` / ``receiver.input@group`` of its kept edges), its ``side`` (the groups of
    positions where its output matters), its mean ablation at each group's positions alone, and why it
    was added (``added``) if it was."""

    needed_by: list[str]
    reads: dict[str, list[str]]
    writes: dict[str, list[str]]
    side: str
    ablated_at: dict[str, Estimate]
    added: str | None = None

    def to_dict(self) -> dict:
        return {"needed_by": self.needed_by, "reads": self.reads, "writes": self.writes, "side": self.side,
                "ablated_at": {g: {"cost": c, "se": se} for g, (c, se) in self.ablated_at.items()},
                **({"added": self.added} if self.added is not None else {})}  # fmt: skip


@dataclass(frozen=True)
class CircuitResult:
    """What ``discover`` found. On the search contexts: the model's NLL, the BMA's and the plateau's, and
    its ``progress``. If that progress is not beyond 2 standard errors of zero, ``refused`` says so and
    nothing else is measured (a share of nothing is no measurement). Otherwise: the circuit's ``nodes`` and
    ``edges``, each node's role and mean-ablation cost alone (every head and MLP), each corruption's search,
    and the answers on ``held_out`` contexts the search never saw and on a ``replicate`` sample as large (a
    circuit of nodes: where its work fits in what ``exact_budget`` leaves; else ``replicate_note`` says why not).
    ``scoring_note``: why the edges were ranked by EAP-IG instead of exact patching, if they were (the JSON's
    ``scored_with``). ``level`` ``"nodes"``: the circuit is a set of heads and MLPs with every edge among
    them (``level_note`` says why, ``node_attribution`` holds every node's cost to first order, ``node_costs``
    those measured exactly; the edges' scores are EAP's, there is no faithfulness curve, and faithfulness
    under an averaged corruption is mean-ablation sufficiency, one measurement). ``timings``: each stage's wall and CPU seconds (not in the JSON: they vary run to run)."""

    config: CircuitConfig
    checkpoint_hash: str | None
    n_edges_total: int
    nll: float
    nll_bma: float
    nll_plateau: float
    progress: Estimate
    n_contexts: int
    refused: str | None = None
    nodes: list[Node] = field(default_factory=list)
    node_roles: dict[Node, NodeRole] = field(default_factory=dict)
    node_costs: dict[Node, Estimate] = field(default_factory=dict)
    edges: list[KeptEdge] = field(default_factory=list)
    searches: dict[str, CorruptionSearch] = field(default_factory=dict)
    held_out: Measurement | None = None
    replicate: Measurement | None = None
    replicate_note: str | None = None  # why there is no replicate where the search found a circuit (its budget)
    n_held_out: int | None = None
    n_mean_reference: int | None = None
    forward_passes: int | None = 0  # the edge-level runners' (None for a circuit of nodes: not counted)
    context_runs: int | None = 0
    interventions: list[dict] = field(default_factory=list)
    scoring_note: str | None = None  # why the edges were ranked by EAP-IG, not by the exact patching asked for
    trained_on: str = "all"  # the target positions the model's loss used (Subject.trained_on)
    level: str = "edges"  # what the circuit was chosen as: edges, or nodes with every edge among them
    level_note: str | None = None  # a circuit of nodes: why, and how it was found
    node_attribution: dict[Node, Estimate] = field(default_factory=dict)  # nodes: each one's cost to first order
    timings: dict[str, tuple[float, float]] = field(default_factory=dict, compare=False)  # stage: (wall, CPU) s
    work: dict[str, float] = field(default_factory=dict)  # FLOPs per stage, counted before the search ran
    edges_pruned: bool = False  # a circuit of nodes whose edges were pruned among them (else every edge among them)

    @property
    def corruptions(self) -> list[str]:
        return list(self.config.corruptions)

    @property
    def faithfulness(self) -> Estimate | None:
        """Held out: the share of the progress the circuit's edges keep under the first corruption."""
        return None if self.held_out is None else self.held_out.faithfulness[self.corruptions[0]]

    @property
    def sufficiency(self) -> Estimate | None:
        """Held out: the share its nodes keep with every other head and MLP mean-ablated."""
        return None if self.held_out is None else self.held_out.sufficiency["mean"]

    @property
    def missed(self) -> list[str]:
        """Where the circuit, searched for to keep ``target`` of the progress (top-n without ``n_edges``, no
        ``nodes`` given), keeps less on the held-out contexts by more than 2 standard errors: one sentence per
        answer that falls short (the search met the target on its own contexts; these are fresh ones)."""
        cfg = self.config
        if self.held_out is None or cfg.search != "top-n" or cfg.n_edges is not None or cfg.nodes is not None:
            return []
        answers = {**{f"faithfulness under {c}": e for c, e in self.held_out.faithfulness.items()},
                   "sufficiency (mean-ablated)": self.held_out.sufficiency["mean"]}  # fmt: skip
        return [f"held-out {what} {share:.3f} +- {se:.3f} is below the target {cfg.target:g} by more than 2 SE"
                for what, (share, se) in answers.items() if share + 2 * se < cfg.target]  # fmt: skip

    def summary(self) -> str:
        """The text ``python -m analyses.circuit`` prints (``models.interp.circuit.report.summary``), the seconds
        each stage took in this run beside the work counted before it."""
        from models.interp.circuit.report import summary

        data = self.to_dict()
        if "work" in data:
            data["work"]["seconds"] = {k: wall for k, (wall, _) in self.timings.items()}
        return summary(data)

    def figures(self, title: str = "model") -> dict:
        """``{"circuit_graph": Figure, "circuit_curve": Figure}``: the graph of the circuit's nodes and kept edges,
        and its faithfulness curve (``title``: the model's name, for the titles)."""
        from models.interp.circuit.report import figures

        return figures(self.to_dict(), title)

    def to_dict(self) -> dict:
        """The JSON ``python -m analyses.circuit`` writes as its ``results``."""
        cfg, corruptions = self.config, self.corruptions
        averaged = all(CORRUPTIONS[c].averaged for c in corruptions)
        about = {
            "n_edges_total": self.n_edges_total, "corruptions": corruptions, "method": cfg.method,
            "direction": cfg.direction, "ablation": "mean" if averaged else "patch from a run on other contexts",
            "corruption": " + ".join(CORRUPTIONS[c].words for c in corruptions), "metric": METRIC,
            "positions": cfg.positions, "trained_on": self.trained_on,
            "search": cfg.search, "target": cfg.target, "min_z": cfg.min_z, "target_se": cfg.target_se,
            "checkpoint_hash": self.checkpoint_hash,
            "nll": self.nll, "nll_bma": self.nll_bma, "nll_plateau": self.nll_plateau,
            "progress": self.progress.value, "progress_se": self.progress.se,
        }  # fmt: skip
        if self.refused is not None:
            return {"refused": self.refused, "nodes": [], "edges": [], **about, "n_contexts": self.n_contexts,
                    "forward_passes": self.forward_passes, "context_runs": self.context_runs}  # fmt: skip
        first = self.searches[corruptions[0]].to_dict()
        h = self.held_out
        return {
            "nodes": [str(n) for n in self.nodes],
            "node_roles": {str(n): r.to_dict() for n, r in self.node_roles.items()},
            "node_costs": {str(n): {"cost": c, "se": s} for n, (c, s) in self.node_costs.items()},
            "edges": [e.to_dict() for e in self.edges],
            "n_edges_total": self.n_edges_total, "corruptions": corruptions,
            "searches": {c: s.to_dict() for c, s in self.searches.items()},
            "all_edges": first["all_edges"], "by_input": first["by_input"],
            **{k: about[k] for k in ("method", "direction", "ablation", "corruption", "metric", "positions",
                                     "trained_on", "search", "target",
                                     "min_z", "target_se", "checkpoint_hash", "nll", "nll_bma", "nll_plateau",
                                     "progress", "progress_se")},
            "faithfulness": self.faithfulness.value, "faithfulness_se": self.faithfulness.se,
            "faithfulness_means": CORRUPTIONS[corruptions[0]].means,
            "sufficiency": self.sufficiency.value, "sufficiency_se": self.sufficiency.se,
            "sufficiency_means": f"{COMPUTES}: its nodes alone, every other head and MLP mean-ablated "
                                 f"({NODE_ABLATIONS['mean']})",
            "held_out": h.to_dict(), "replicate": None if self.replicate is None else self.replicate.to_dict(),
            **({} if self.replicate_note is None else {"replicate_note": self.replicate_note}),
            **{k: first[k] for k in ("kl_to_full", "kl_to_full_se") if k in first},
            "curve": first["curve"], "curve_area": first["curve_area"],
            **{k: first[k] for k in ("denoising_curve", "denoising_curve_area", "denoising_faithfulness",
                                     "denoising_faithfulness_se", "denoising_cost", "denoising_cost_se") if k in first},
            "n_contexts": self.n_contexts, "n_held_out": self.n_held_out,
            "n_held_out_fixed": cfg.n_held_out is not None, "n_mean_reference": self.n_mean_reference,
            "forward_passes": self.forward_passes, "context_runs": self.context_runs,
            "interventions": self.interventions,
            "work": {"counted_tflop": {k: v / 1e12 for k, v in self.work.items()}},  # seconds vary: not in the JSON
            **({} if self.scoring_note is None else {"scored_with": "eap-ig", "scoring_note": self.scoring_note}),
            **({"missed_target": self.missed} if self.missed else {}),
            **({} if self.level == "edges" else {
                "level": self.level, "scored_with": "eap", "level_note": self.level_note,
                "edges_pruned": self.edges_pruned,
                "node_attribution": {str(n): {"cost": c, "se": s} for n, (c, s) in self.node_attribution.items()}}),
        }  # fmt: skip
