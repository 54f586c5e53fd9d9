"""Circuit discovery in one call: ``discover(subject, CircuitConfig(...)) -> CircuitResult``.

Scores every edge under each corruption, chooses the nodes and the edges, and answers two questions on
held-out contexts the search never saw: the share of the model's progress the circuit's edges keep under
each corruption (faithfulness), and the share its nodes keep with every other head and MLP ablated
(sufficiency). ``analyses.circuit``'s docstring says the rules in words; this module is them. On a model
whose edge-level search is counted beyond ``exact_budget`` (a model deeper or wider than the shipped ones), the
circuit is chosen as nodes, its edges pruned among them where the budget allows (``CircuitConfig.level``;
``_node_circuit``), every stage streaming the contexts a part at a time.

    import models
    from models.interp.circuit import CircuitConfig, discover

    result = discover(models.load_subject("standard"), CircuitConfig(n_held_out=256))
    print(result.nodes, result.faithfulness, result.sufficiency)
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from contextlib import contextmanager
from functools import partial

import torch
from torch import Tensor

from models.interp.baselines import per_context_baselines
from models.interp.circuit.attribution import attribution, input_grads
from models.interp.circuit.config import LEVELS, MAX_HELD_OUT, MIN_HELD_OUT, CircuitConfig
from models.interp.circuit.corruptions import CORRUPTIONS, denoising_runner, source_writes
from models.interp.circuit.exact import copy_runs
from models.interp.circuit.graph import Edge, Graph, Node, build_graph
from models.interp.circuit.methods import METHODS
from models.interp.circuit.nodes import (
    NODE_ABLATIONS,
    mean_outputs,
    node_ablated_values,
    node_attribution,
    node_costs,
    node_outputs,
    output_grads,
    output_hooks,
    outside,
    outside_interventions,
    record_outputs,
    run_and_record,
)
from models.interp.circuit.result import (
    CircuitResult,
    CorruptionSearch,
    Denoising,
    Estimate,
    InputSum,
    KeptEdge,
    Measurement,
    NodeRole,
    ScoredEdge,
)
from models.interp.circuit.runner import ROWS, Runner, sender_writes
from models.interp.circuit.scores import (
    EdgeScores,
    area,
    beyond_2se,
    curve_sizes,
    faithfulness,
    kl_to_full,
    mean_se,
    ratio_se,
    restored,
)
from models.interp.circuit.search import SEARCHES, among, ranked
from models.interp.interventions import Intervention, description
from models.interp.memory import flops_per_context
from models.interp.subject import Subject
from models.plumbing.io import MEMORY_FRACTION, check_memory, memory_limit, size
from models.plumbing.progress import progress
from probes.metrics import per_context_nll

PASS_BYTES = 768 * 2**20  # a pass's activations (twice what the hooks see, as check_fits counts them) at most
N_MEAN = 2048  # held-out contexts whose mean is each sender's / node's mean-ablated value
N_MEAN_NODES = 512  # the same at the level of nodes, where each run of them is one of a big model
NODES_EXACT = 12  # at the level of nodes: the first-ranked heads and MLPs whose cost alone is measured exactly
COST_Z = 3.0  # a node whose mean ablation alone costs more than this many standard errors is in the circuit
SEEDS = {"held_out": 1_000_003, "replicate": 2_000_006, "reference": 3_000_009,  # offsets from the config's seed
         "more_held_out": 4_000_012}


def sample(task, n: int, seed: int) -> torch.Tensor:
    """``n`` fresh contexts of ``task``, ``[n, T]``, a function of ``seed`` only."""
    return task.sample(n, torch.Generator().manual_seed(seed))[0]


def named_edges(graph: Graph, names) -> list[Edge]:
    """Every edge between the named heads / MLPs, the embeddings and the output; ValueError naming a node
    the graph does not have."""
    bad = [n for n in names if n not in set(graph.node_order)]
    if bad:
        raise ValueError(f"nodes: no node {', '.join(bad)} in this model's graph; nodes: "
                         f"{', '.join(map(str, graph.node_order))}")  # fmt: skip
    return among(graph, names)


def context_bytes(subject: Subject, graph: Graph) -> tuple[int, int, int]:
    """Memory one more context costs, about: (the senders' writes a ``Runner`` holds, one forward pass's
    activations, the heads' and MLPs' outputs a node-level answer records), measured on one context (each
    storage counted once)."""
    seen: dict[int, tuple[int, Tensor]] = {}

    def grab(t, hook):  # each kept alive till the count, so that no two activations share a freed address
        if isinstance(t, torch.Tensor):
            seen[t.untyped_storage().data_ptr()] = (t.untyped_storage().nbytes(), t)

    one = sample(subject.task, 1, 0)
    with warnings.catch_warnings():  # hooking every name: the bridge warns of gated ones
        warnings.simplefilter("ignore")
        # every name but the unembedding's (a hook there makes the read-out run the whole vocabulary)
        writes, _ = sender_writes(subject, graph, one, [(lambda name: "unembed" not in name, grab)])
    held = {w.untyped_storage().data_ptr(): w.untyped_storage().nbytes() for w in writes.values()}
    recorded = record_outputs(subject, one, output_hooks(node_outputs(subject, graph)))
    outputs = sum(v.numel() * v.element_size() for v in recorded.values())
    return sum(held.values()), sum(n for n, _ in seen.values()), outputs


def search_run_flops(subject: Subject, config: CircuitConfig) -> float:
    """FLOPs of one run of the ``config.n_contexts`` search contexts, counted from the weights
    (``flops_per_context``): the unit every budget decision counts in."""
    return flops_per_context(subject) * config.n_contexts


def scoring_method(subject: Subject, graph: Graph, config: CircuitConfig) -> tuple[str, str | None]:
    """The score method to run, and why it is not the one asked for, if it is not: exact patching whose counted
    work (each run of the search contexts it makes, ``copy_runs``, at ``flops_per_context`` each context) is
    beyond ``exact_budget`` teraFLOPs is replaced by EAP-IG. Counted from the weights and the config only."""
    one_pass = search_run_flops(subject, config)
    estimate = copy_runs(graph) * len(config.corruptions) * one_pass
    if config.method != "exact" or estimate <= config.exact_budget * TERA:
        return config.method, None
    return "eap-ig", (f"exact edge patching of the {len(graph.edges)} edges would take {estimate / TERA:.1f} "
                      f"TFLOP ({copy_runs(graph)} runs of the {config.n_contexts} contexts per corruption at "
                      f"{one_pass / TERA:.3g} TFLOP each, counted from the weights), beyond --exact-budget "
                      f"{config.exact_budget:g} TFLOP: the edges are ranked by EAP-IG ({config.ig_steps} steps) "
                      "instead, and the circuit chosen is judged by exact runs")  # fmt: skip


def edge_level_work(subject: Subject, graph: Graph, config: CircuitConfig) -> dict[str, float]:
    """FLOPs, per stage, of a circuit at the level of edges on the search contexts, counted from the weights and
    the config before any of it runs (each run of the search contexts at ``flops_per_context`` a context): the
    edges' scores by the method ``scoring_method`` picks (exact: ``copy_runs`` runs; EAP: a pass with gradients,
    3 runs; EAP-IG: 3 runs a step), per corruption; the node costs (one run per head and MLP, one more per group
    of positions, and the mean-ablation reference); the curves and searches (per corruption, the curve's points,
    the top-n bisection's steps, the circuit and its KL, each at most one run per receiver and per level, and
    one more; twice when denoising). The held-out answers come after and are not counted here."""
    one = search_run_flops(subject, config)
    k = len(config.corruptions)
    method = scoring_method(subject, graph, config)[0]
    per_method = {"exact": copy_runs(graph), "eap": 3, "eap-ig": 3 * config.ig_steps}
    groups = len(graph.groups[graph.receivers[0].site]) if graph.family == "standard" else 0
    nodes = len(node_outputs(subject, graph))
    evaluations = config.curve_points + len(graph.edges).bit_length() + 2
    runs = len(graph.receivers) + len({r.level for r in graph.receivers}) + 1
    return {
        f"edge scores ({method})": per_method.get(method, 3) * k * one,
        "node costs": nodes * (1 + groups) * one + N_MEAN * one / config.n_contexts,
        "faithfulness curves and searches": (2 if config.direction == "denoising" else 1) * k * evaluations * runs * one,
    }


def node_level_work(subject: Subject, graph: Graph, config: CircuitConfig) -> dict[str, float]:
    """FLOPs, per stage, of a circuit at the level of nodes on the search contexts (as ``edge_level_work``): the
    node attribution (a pass with gradients, 3 runs; the reference; a run per corruption that is not averaged)
    and the ``exact_nodes`` node costs. The node search, the EAP scores among the nodes and the answers come after,
    a few runs each, and are not counted here."""
    one = search_run_flops(subject, config)
    others = sum(not CORRUPTIONS[c].averaged for c in config.corruptions)
    return {"node attribution": (3 + others) * one + N_MEAN_NODES * one / config.n_contexts,
            "node costs": exact_nodes(subject, config) * one}  # fmt: skip


def node_answers_work(subject: Subject, config: CircuitConfig, n: int, pruned: Graph | None = None) -> float:
    """FLOPs of the node-level answers on one sample of ``n`` contexts (``_NodeAnswers.measurement``), counted
    from the weights: the clean run; per corruption, the circuit's run and, if not averaged, the run recording
    its other contexts (a run per receiver and level of ``pruned`` and one more, if the edges were pruned);
    mean-ablation sufficiency (the averaged corruption's run, if there is one); the resample's two runs."""
    per_context = flops_per_context(subject)
    runs = 1 + 2  # clean; resample: its other contexts recorded, then the run
    for c in config.corruptions:
        circuit = 1 if pruned is None else len(pruned.receivers) + len({r.level for r in pruned.receivers}) + 1
        runs += circuit + (0 if CORRUPTIONS[c].averaged else 1)
    runs += 0 if any(CORRUPTIONS[c].averaged for c in config.corruptions) and pruned is None else 1
    return runs * n * per_context


def exact_nodes(subject: Subject, config: CircuitConfig) -> int:
    """At the level of nodes, how many heads and MLPs (the first by attribution) are measured exactly: as many
    runs of the search contexts as half of ``exact_budget`` allows, at most ``NODES_EXACT``."""
    one = search_run_flops(subject, config)
    return int(min(NODES_EXACT, config.exact_budget * TERA / 2 // one))


# What attribution holds beyond the search's runners, in a pass's hooked activations per search context: one pass
# with gradients over every search context at once (autograd keeps more than the hooks see), the gradients at every
# receiver's input, and for EAP-IG their running sum over the steps. Measured on the shipped GPT-2 by
# ``python -m bench.attribution_memory`` (peak RSS at 128 and 512 contexts): 5.4 passes (EAP) and 6.3-6.5 (EAP-IG,
# 2 steps); rounded up.
ATTRIBUTION_PASSES = {"eap": 6, "eap-ig": 7}


def check_fits(subject: Subject, config: CircuitConfig, graph: Graph | None = None, level: str = "edges",
               sizes: tuple[int, int, int] | None = None) -> tuple[int, int]:  # fmt: skip
    """One-line ValueError, before any work, if the search or the held-out answers would not fit in memory:
    each Runner holds the senders' clean and ablated writes on its contexts (the search one per corruption,
    two when denoising), a pass runs on ``rows`` contexts or all of them, and the receivers' patched
    activations at most double a pass's. ``rows`` is ``ROWS``, or fewer where a pass of ``ROWS`` contexts
    would take more than a quarter of the memory (a big model). The held-out sample is sized at
    ``n_held_out``, or at its least size. ``rows`` is also at most what keeps a pass within ``PASS_BYTES``
    (the shipped models' passes stay at ``ROWS``; a deep model's are smaller, so that a pass's memory is set
    by one batch, whatever the machine has free). At the ``level`` of nodes every stage streams the contexts
    a part of ``rows`` at a time: only a part's outputs and one pass with gradients are held, whatever
    ``n_contexts`` and ``n_held_out`` (the EAP scores among the chosen nodes hold their writes on a part).
    ``sizes``: ``context_bytes`` measured already. Returns the most held-out contexts that fit, and ``rows``."""
    graph = build_graph(subject) if graph is None else graph
    writes, forward, outputs = context_bytes(subject, graph) if sizes is None else sizes
    rows = max(1, min(ROWS, PASS_BYTES // (2 * forward), int(MEMORY_FRACTION * memory_limit()[0] / 4 // (2 * forward))))
    if level == "nodes":  # every stage runs a part of ``rows`` contexts at a time, the search's too
        part = rows * (3 * outputs + ATTRIBUTION_PASSES["eap"] * forward)
        check_memory(part, f"a part of {rows} contexts at the level of nodes ({size(part / rows)} a context: the "
                           "heads' and MLPs' outputs and a pass with gradients)")  # fmt: skip
        return MAX_HELD_OUT, rows
    runners = len(config.corruptions) * (2 if config.direction == "denoising" else 1)
    n, held = config.n_contexts, config.n_held_out or MIN_HELD_OUT
    search = 2 * writes * runners * n + 2 * forward * max(n, rows)
    check_memory(search, f"n_contexts {n} (the search: {size(2 * writes * runners + 2 * forward)} a context)")
    method = scoring_method(subject, graph, config)[0]
    if method in ATTRIBUTION_PASSES:
        grads = ATTRIBUTION_PASSES[method] * forward * n
        check_memory(search + grads, f"n_contexts {n} with {method} ({size(grads / n)} a context for one pass with "
                                     f"gradients over every search context, besides the search's {size(search)})")  # fmt: skip
    bound = MEMORY_FRACTION * memory_limit()[0]
    answers = 2 * writes * held + 2 * forward * max(held, rows)
    check_memory(search + answers, f"n_held_out {held} ({size(2 * writes + 2 * forward)} a context; the search "
                                   f"holds {size(search)} besides)")  # fmt: skip
    return int((bound - search) // (2 * writes + 2 * forward)), rows


def held_out_size(config: CircuitConfig, plateau: Tensor, full: Tensor, bma: Tensor, most: int | None = None) -> int:
    """The held-out sample's size: ``config.n_held_out``, or the number of contexts on which the model's
    progress would have the standard error ``config.target_se``, from its spread over the pilot contexts
    (``plateau``, ``full``, ``bma``: per-context NLLs ``[batch]``; ``held_out_sample``'s first ``MIN_HELD_OUT``
    held-out contexts): ``ratio_se`` falls as one
    over the square root of the number of contexts, so ``n = ceil(n_pilot * (se_pilot / target_se)^2)``;
    at least ``MIN_HELD_OUT``, at most ``MAX_HELD_OUT`` and ``most`` (what fits in memory)."""
    if config.n_held_out:
        return config.n_held_out
    se = ratio_se(plateau - full, plateau - bma)[1]
    n = math.ceil(len(plateau) * (se / config.target_se) ** 2) if math.isfinite(se) else MAX_HELD_OUT
    return max(MIN_HELD_OUT, min(n, MAX_HELD_OUT, MAX_HELD_OUT if most is None else most))


def held_out_sample(run: "_Discovery") -> tuple[Tensor, Tensor | None]:
    """The held-out contexts, ``[n, T]``, and the clean run's metric on them where it was run (else None):
    ``--n-held-out`` of them, or ``MIN_HELD_OUT`` and as many more (drawn from another stream) as their own
    progress's spread says ``--target-se`` needs (``held_out_size``): a pilot four times the search's, from the
    contexts the answers are measured on (the search's spread, over 128 contexts, overstated the size needed:
    701 contexts for a planted GPT-2-small-shaped model whose progress SE on 512 of them was 0.008)."""
    config, seed = run.config, run.config.seed + SEEDS["held_out"]
    if config.n_held_out:
        return sample(run.task, config.n_held_out, seed), None
    first = sample(run.task, MIN_HELD_OUT, seed)
    full = run_and_record(run.subject, first, [], run.metric, run.rows)[1]
    plateau, bma = per_context_baselines(run.task, first, config.positions)
    n = held_out_size(config, plateau, full, bma, run.most_held_out)
    if n == len(first):
        return first, full
    more = sample(run.task, n - len(first), config.seed + SEEDS["more_held_out"])
    return torch.cat([first, more]), torch.cat([full, run_and_record(run.subject, more, [], run.metric, run.rows)[1]])


def measure(
    subject: Subject, graph: Graph, tokens, edges, nodes, corruptions, seed: int, rows: int = ROWS,
    positions: str = "all",
) -> Measurement:
    """On ``tokens``: the model's progress, the circuit ``edges``' faithfulness under each corruption (every
    other edge ablated), and the sufficiency of ``nodes`` (every other head and MLP mean- or resample-
    ablated), each with its standard error over the contexts; NLLs at the target ``positions``."""
    task = subject.task
    metric = partial(per_context_nll, positions=positions)
    plateau, bma = per_context_baselines(task, tokens, positions)
    shares, full, clean = {}, None, sender_writes(subject, graph, tokens)
    for c in _bar(corruptions, f"faithfulness on {len(tokens)} contexts"):
        runner = Runner(subject, graph, tokens, source_writes(subject, graph, tokens, c, seed), metric, clean=clean,
                        rows=rows)  # fmt: skip
        full = runner.clean_values
        shares[c] = Estimate(*ratio_se(plateau - runner.keep_only_values(edges), plateau - full))
    progress = Estimate(*ratio_se(plateau - full, plateau - bma))
    reference = {"mean": sample(task, N_MEAN, seed + SEEDS["reference"]),
                 "resample": sample(task, len(tokens), seed + SEEDS["reference"] + 1)}  # fmt: skip
    sufficiency = {}
    for ablation, ref in reference.items():
        values = node_ablated_values(subject, graph, tokens, nodes, ablation, ref, metric, rows=rows)
        sufficiency[ablation] = Estimate(*ratio_se(plateau - values, plateau - full))
    return Measurement(len(tokens), shares, progress, full.mean().item(), sufficiency)


def kept_union(edges: list[Edge], kept_by: dict[str, list[Edge]]) -> list[Edge]:
    """The edges of ``edges`` that some corruption's circuit (``kept_by``) keeps, in ``edges``' order."""
    kept = [set(k) for k in kept_by.values()]
    return [e for e in edges if any(e in k for k in kept)]


def kept_edge_rows(union: list[Edge], kept_by: dict[str, list[Edge]], score_of: dict) -> list[KeptEdge]:
    """Each edge of ``union`` with its score (``score_of``: edge -> (score, se, corruption)) and the corruptions
    whose circuits keep it, largest score first."""
    kept = {c: set(k) for c, k in kept_by.items()}
    rows = [KeptEdge(e, *score_of[e], tuple(c for c in kept_by if e in kept[c])) for e in union]
    return sorted(rows, key=lambda e: -abs(e.score))


def fewest_first(candidates: list[Node], share_of, kept, words) -> dict[Node, str]:
    """The first nodes of ``candidates`` to add: the fewest first ones with which ``kept(share_of(them))`` holds
    (every candidate if none does), found by doubling their number from 0 until it holds, then bisecting: about
    2 log2(k) runs for k nodes, where adding one at a time took k + 1, and the same nodes where the share grows
    as nodes are added. Each node's reason, ``words(share, before)``: the share of the longest prefix measured
    up to it (``before`` "it", or the node that prefix stops before; the nodes between were not measured)."""
    measured: dict[int, Estimate] = {}

    def keeps(k: int) -> bool:
        measured[k] = share_of(candidates[:k])
        return kept(measured[k])

    if keeps(0):
        return {}
    lo, hi, k = 0, len(candidates), 1
    while k < len(candidates):
        if keeps(k):
            hi = k
            break
        lo, k = k, 2 * k
    while hi - lo > 1:  # every prefix measured below hi falls short; hi keeps it (or is every candidate)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if keeps(mid) else (mid, hi)
    reasons = {}
    for j in range(hi):
        m = max(i for i in measured if i <= j)
        reasons[candidates[j]] = words(measured[m], "it") if m == j else (
            words(measured[m], candidates[m]) + " (the nodes from there to it not measured alone: the search doubles, "
            "then bisects)")  # fmt: skip
    return reasons


def input_sums(values: EdgeScores) -> list[InputSum]:
    """Per layer's heads (``L1``) or other receiver (``MLP0``, ``output``), input and position group: the
    summed score of every edge into it, with its standard error over the contexts."""
    rows: dict = {}
    for e, v in values.items():
        node = f"L{e.receiver.layer}" if e.receiver.kind == "head" else str(e.receiver)
        rows.setdefault((node, e.input, e.group), []).append(v)
    return [InputSum(node, inp, group, len(vs), *mean_se(torch.stack(vs).sum(0)))
            for (node, inp, group), vs in rows.items()]  # fmt: skip


def node_roles(kept_by: dict, nodes: list[Node], added: dict, at: dict) -> dict[Node, NodeRole]:
    """Per node of the circuit: which corruptions' circuits need it, at which positions it reads and writes
    (the groups of its kept edges), why it was added if it was, and (``at``: per group of positions, its
    mean ablation there alone) where its output matters: its side is the groups where that costs more than
    ``COST_Z`` standard errors (else the groups of its kept edges)."""
    roles = {}
    for n in nodes:
        costly = {g for g, (c, se) in at.get(n, {}).items() if c > COST_Z * se}
        reads = {c: sorted({f"{e.input}@{e.group}" for e in kept if e.receiver == n}) for c, kept in kept_by.items()}
        writes = {c: sorted({f"{e.receiver}.{e.input}@{e.group}" for e in kept if e.sender == n})
                  for c, kept in kept_by.items()}  # fmt: skip
        needed = [c for c in kept_by if reads[c] or writes[c]]
        groups = costly or {g.split("@")[1] for c in needed for g in reads[c] + writes[c]}
        side = (
            "target side"
            if groups == {"target"}
            else "demonstration side"
            if groups == {"demonstrations"}
            else "both sides"
            if {"target", "demonstrations"} <= groups
            else ", ".join(sorted(groups)) or "none"
        )
        roles[n] = NodeRole(needed, reads, writes, side, dict(at.get(n, {})), added.get(n))
    return roles


TERA = 1e12  # --exact-budget's unit: teraFLOPs


def _refused(progress: Estimate, n: int) -> str | None:
    """Why no share of the progress can be measured, if it cannot: the progress is not beyond 2 SE of zero."""
    if beyond_2se(progress.value, progress.se):
        return None
    if progress.value < -2 * progress.se:
        return (f"the model's progress over the uniform-parent plateau is {progress.value:.3f} +- {progress.se:.3f} on "
                f"the {n} search contexts: the model is worse than the uniform-parent plateau, below it by more than 2 "
                "standard errors; a share of a negative progress means nothing, so no circuit is reported")  # fmt: skip
    return (f"the model's progress over the uniform-parent plateau is {progress.value:.3f} +- {progress.se:.3f} on "
            f"the {n} search contexts, not beyond 2 standard errors of zero: a share of it would be a share of "
            "nothing, so no circuit is reported")  # fmt: skip


class _Discovery:
    """One call of ``discover``: what its steps share (the subject, the graph, the search contexts and their
    baselines, the runners of each corruption, the mean-ablation reference recorded once)."""

    def __init__(self, subject: Subject, config: CircuitConfig):
        config = dataclasses.replace(config, positions=subject.scored_positions(config.positions))  # recorded resolved
        self.subject, self.config, self.task = subject, config, subject.task
        self.metric = partial(per_context_nll, positions=config.positions)  # resolved: never "trained" here
        self.graph = build_graph(subject)
        self.named = named_edges(self.graph, config.nodes) if config.nodes is not None else None  # before any work
        self.fits = {}  # per level: (the most held-out contexts, rows), or why they do not fit; level() picks
        sizes = context_bytes(subject, self.graph)
        for level in LEVELS[1:] if config.level == "auto" else (config.level,):
            try:
                self.fits[level] = check_fits(subject, config, self.graph, level, sizes)
            except ValueError as e:
                self.fits[level] = e
        if all(isinstance(f, ValueError) for f in self.fits.values()):
            raise next(iter(self.fits.values()))
        self.tokens = sample(self.task, config.n_contexts, config.seed)
        self.plateau, self.bma = per_context_baselines(self.task, self.tokens, config.positions)
        self.corruptions, self.stages = list(config.corruptions), Stages()
        # the work of one run of the search contexts, counted from the weights (never measured: the same command
        # makes the same decisions on every machine)
        self.pass_flops = search_run_flops(subject, config)
        self.chosen_level = self.level()  # a level whose sizes do not fit is refused here, before any work
        with self.stages("clean and corrupted runs"):
            if self.chosen_level[0] == "edges":  # every sender's writes: the runners share them
                self.clean = sender_writes(subject, self.graph, self.tokens)
                self.full = self.metric(self.clean[1], self.tokens)
            else:  # the nodes' writes only, once they are chosen (``build_runners``)
                self.clean = None
                self.full = run_and_record(subject, self.tokens, [], self.metric, self.rows)[1]
        self.progress = Estimate(*ratio_se(self.plateau - self.full, self.plateau - self.bma))
        self.runners: dict[str, Runner] = {}

    def build_runners(self) -> dict[str, Runner]:
        """Each corruption's Runner on the search contexts, sharing the clean run (the level of edges; a circuit
        of nodes streams its own, ``_edge_attribution_in_parts``)."""
        with self.stages("clean and corrupted runs"):
            self.runners = {c: Runner(self.subject, self.graph, self.tokens,
                                      source_writes(self.subject, self.graph, self.tokens, c, self.config.seed),
                                      self.metric, clean=self.clean, rows=self.rows)
                            for c in self.corruptions}  # fmt: skip
        return self.runners

    def result(self, **found) -> CircuitResult:
        return CircuitResult(
            self.config, self.subject.hash, len(self.graph.edges), self.full.mean().item(), self.bma.mean().item(),
            self.plateau.mean().item(), self.progress, len(self.tokens), trained_on=self.subject.trained_on,
            timings=self.stages.times, work=self.work, **found)  # fmt: skip

    def method(self) -> tuple[str, str | None]:
        """The score method to run, and why it is not the one asked for (``scoring_method``)."""
        return scoring_method(self.subject, self.graph, self.config)

    def level(self) -> tuple[str, str | None]:
        """What the circuit is chosen as, and why, if it was not asked for: ``config.level``, or (auto) nodes
        where the search at the level of edges is counted beyond ``exact_budget`` teraFLOPs
        (``edge_level_work``), or where the edge-level answers would not fit in memory; else edges. A level
        whose answers do not fit is refused here (ValueError). Sets ``work``: the counted FLOPs per stage."""
        config = self.config
        work = edge_level_work(self.subject, self.graph, config)
        total = sum(work.values())
        if config.level != "auto":
            level, why = config.level, None
        elif isinstance(self.fits["edges"], ValueError):
            level, why = "nodes", f"the edge-level answers would not fit in memory ({self.fits['edges']})"
        elif total > config.exact_budget * TERA and config.direction == "noising":
            level, why = "nodes", (f"the search at the level of edges counts {total / TERA:.1f} TFLOP on the "
                                   f"{len(self.tokens)} search contexts (" + ", ".join(
                                       f"{k} {v / TERA:.2g}" for k, v in work.items()) + "; counted from the weights), "
                                   f"beyond --exact-budget {config.exact_budget:g} TFLOP")  # fmt: skip
        else:
            level, why = "edges", None
        if isinstance(self.fits[level], ValueError):
            raise self.fits[level]
        self.most_held_out, self.rows = self.fits[level]
        self.work = work if level == "edges" else node_level_work(self.subject, self.graph, config)
        return level, why

    def scores(self, method: str) -> dict:
        """Per corruption: (its runner, the runner scored (the denoising one, if denoising), the edges'
        scores ``[edge, context]`` by ``method``, ``{edge: (mean, se)}``, the edges ranked)."""
        scored = {}
        for c in self.corruptions:
            with self.stages(f"edge scores ({c})"):
                runner = self.runners[c]
                scorer = (denoising_runner(self.subject, self.graph, self.tokens, c, self.config.seed, self.metric)
                          if self.config.direction == "denoising" else runner)  # fmt: skip
                values = METHODS[method].score(scorer, self.config)
                stats = values.with_se()
                scored[c] = (runner, scorer, values, stats, ranked(stats, self.config.min_z))
        return scored

    def mean_sufficiency(self, reference, recorded: dict):
        """``sufficient(nodes)``: the share of the progress on the search contexts that ``nodes`` alone keep,
        every other head and MLP mean-ablated (its mean over ``reference``, whose outputs are ``recorded``)."""

        def sufficient(ns) -> float:
            values = node_ablated_values(
                self.subject, self.graph, self.tokens, ns, "mean", reference, self.metric, recorded=recorded,
                rows=self.rows,
            )
            return Estimate(*ratio_se(self.plateau - values, self.plateau - self.full))

        return sufficient

    def choose_nodes(self, costs: dict, by_cost: list[Node], by_weight: dict, sufficient,
                     faithful, within_se: float = 0.0) -> tuple[list[Node], dict]:  # fmt: skip
        """The nodes: every head or MLP whose mean ablation alone costs > COST_Z standard errors (``costs``),
        then the fewest first others in the order ``by_cost`` with which the nodes alone (the rest mean-ablated)
        keep ``target`` of the progress (``sufficient(nodes)``, an ``Estimate`` of the share), then, for each
        corruption c whose circuit among them does not keep ``target`` (``faithful(c, nodes)``), the fewest first
        in the order ``by_weight[c]`` (``fewest_first``). ``within_se``: a share below the target by at most this
        many of its standard errors counts as keeping it (at the level of nodes, 2: else, once the share sits at
        the target within its error, every further node, each adding nothing beyond noise, would be added).
        Returns them in the graph's order and why each was added."""
        target = self.config.target

        def kept(share: Estimate) -> bool:
            return share.value >= target - within_se * share.se

        added: dict = {}
        for n, (cost, cost_se) in costs.items():
            if cost > COST_Z * cost_se:
                added[n] = f"its mean ablation alone costs {cost:+.4f} +- {cost_se:.4f} nats (> {COST_Z:g} SE)"
        added |= fewest_first(
            [n for n in by_cost if n not in added], lambda more: sufficient([*added, *more]), kept,
            lambda share, before: f"the nodes before {before} alone kept {share.value:.3f} +- {share.se:.3f} < "
                                  f"{target:g} of the progress, rest mean-ablated")  # fmt: skip
        for c in self.corruptions:
            added |= fewest_first(
                [n for n in by_weight[c] if n not in added], lambda more, c=c: faithful(c, [*added, *more]), kept,
                lambda share, before, c=c: f"the edges among the nodes before {before} kept {share.value:.3f} +- "
                                           f"{share.se:.3f} < {target:g} under {c}")  # fmt: skip
        return [n for n in self.graph.node_order if n in added], added

    def edge_weights(self, scored: dict, costs: dict) -> dict[str, list[Node]]:
        """Per corruption, the nodes by the summed |score| of their edges, descending."""
        out = {}
        for c in self.corruptions:
            stats = scored[c][3]
            weight = {n: sum(abs(x) for e, (x, _) in stats.items() if n in (e.sender, e.receiver)) for n in costs}
            out[c] = sorted(costs, key=lambda n: -weight[n])
        return out

    def search(self, c: str, scored: dict, within: set, sizes: list[int]) -> tuple[CorruptionSearch, list[Edge]]:
        """Corruption ``c``'s circuit among the edges ``within``, its faithfulness and curve on the search
        contexts (and, denoising, the same restored in the corrupted run)."""
        runner, scorer, values, stats, order = scored[c]
        plateau, full, edges = self.plateau, self.full, self.graph.edges
        with self.stages("faithfulness curves"):
            curve = [faithfulness(runner, order[:n], plateau, full) for n in _bar(sizes, f"faithfulness curve ({c})")]
        inner = [e for e in order if e in within]  # the search keeps edges among the nodes only
        scores = {e: stats[e][0] for e in inner}
        with self.stages("edge searches"):
            kept = self.named if self.named is not None else SEARCHES[self.config.search].choose(
                runner, scores, inner, self.config, plateau, full)  # fmt: skip
            found = faithfulness(runner, kept, plateau, full)
        row = lambda e: ScoredEdge(e, *stats[e])  # noqa: E731
        denoising = None
        if scorer is not runner:
            with self.stages("faithfulness curves"):
                back = [restored(scorer, order[:n], full) for n in _bar(sizes, "denoising faithfulness curve")]
                d = restored(scorer, kept, full)
            denoising = Denoising(back, area(back, len(edges)), Estimate(d.faithfulness, d.se),
                                  Estimate(*mean_se(scorer.clean_values - full)))  # fmt: skip
        kl = None
        if c == self.corruptions[0]:
            with self.stages("edge searches"):
                kl = Estimate(*kl_to_full(runner, kept, self.subject.log_probs(self.tokens).double()))
        block = CorruptionSearch(
            c, [row(e) for e in sorted(kept, key=lambda e: -abs(stats[e][0]))],
            sum(abs(stats[e][0]) <= 2 * stats[e][1] for e in kept),
            sum(abs(s) > self.config.min_z * se for s, se in stats.values()),
            Estimate(found.faithfulness, found.se), curve, area(curve, len(edges)), [row(e) for e in edges],
            input_sums(values), denoising, kl)  # fmt: skip
        return block, kept

    def interventions(self) -> list[dict]:
        """Every intervention the answers make, described (``models.interp.interventions.description``)."""
        graph = self.graph
        sites = sorted({(graph.receiver_of(e).site, graph.receiver_of(e).capture) for e in graph.edges})
        out = [description(site, "add", f"ablated senders' change: {CORRUPTIONS[c].words}")
               for c in self.corruptions for site, _ in sites]  # fmt: skip
        out += [description(c, "patch", "the receiver's activation recomputed from its edited input")
                for c in sorted({c for _, c in sites if c})]  # fmt: skip
        out += [description(hook, kind, f"every head / MLP outside the circuit: {NODE_ABLATIONS[a]}")
                for a, kind in (("mean", "mean"), ("resample", "patch"))
                for hook in output_hooks(node_outputs(self.subject, graph))]  # fmt: skip
        return out


class Stages:
    """Wall and CPU seconds spent in each named stage of one call, ``times`` ``{stage: (wall, cpu)}`` in the
    order the stages first ran (a stage entered again adds to its total). ``with stages("node costs"): ...``"""

    def __init__(self):
        self.times: dict[str, tuple[float, float]] = {}

    @contextmanager
    def __call__(self, name: str):
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            w, c = self.times.get(name, (0.0, 0.0))
            self.times[name] = (w + time.perf_counter() - wall, c + time.process_time() - cpu)


def _bar(items, desc: str):
    """Progress over ``items`` (``models.plumbing.progress``: a bar on a terminal, a line every 30 s with
    the time left otherwise)."""
    return progress(items, f"circuit: {desc}", leave=False)


@torch.no_grad()
def discover(subject: Subject, config: CircuitConfig | None = None) -> CircuitResult:
    """Find ``subject``'s circuit as ``config`` (default ``CircuitConfig()``) asks; see the module docstring.
    Bad input (a node the graph lacks, sizes that do not fit in memory, a model without the hooks the graph
    needs) is a one-line ValueError before any work. A model whose progress over the plateau on the search
    contexts is not beyond 2 standard errors of zero gets a result with ``refused`` set and no circuit. Exact
    edge patching counted to take more than ``config.exact_budget`` teraFLOPs is replaced by EAP-IG (the
    result's ``scoring_note`` says so). The result's ``timings`` hold each stage's wall and CPU seconds.

    Args:
        subject: the model under study (``models.load_subject``), any family.
        config: what to do: every option of ``python -m analyses.circuit`` as a field with the same default
            (the search contexts, the corruptions, the method, the held-out size, ...).

    Returns:
        What was found: the circuit's ``nodes`` and ``edges``, each corruption's search, and the two answers on
        held-out contexts, faithfulness and sufficiency, with their standard errors (``to_dict()``: the JSON
        the command line writes); or ``refused`` and no circuit.

    Raises:
        ValueError: bad input, in one line, before any work.
    """
    if not isinstance(subject, Subject):
        raise TypeError(f"subject must be a models.Subject, got {type(subject).__name__}; make one with "
                        "models.load_subject(path)")  # fmt: skip
    if config is not None and not isinstance(config, CircuitConfig):
        raise TypeError(f"config must be a CircuitConfig, got {type(config).__name__}; make one with "
                        "CircuitConfig(n_contexts=..., ...)")  # fmt: skip
    run = _Discovery(subject, CircuitConfig() if config is None else config)
    config = run.config  # its positions resolved
    reason = _refused(run.progress, len(run.tokens))
    if reason is not None:
        return run.result(refused=reason)
    graph, tokens, corruptions, stage = run.graph, run.tokens, run.corruptions, run.stages
    level, why = run.chosen_level
    if level == "nodes":
        if config.n_edges is not None:
            raise ValueError(f"n_edges {config.n_edges} applies to a circuit of edges, and level auto chose nodes "
                             f"({why}); use --level edges, or leave --n-edges out")  # fmt: skip
        return _node_circuit(run, why)
    run.build_runners()
    method, note = run.method()
    scored = run.scores(method)
    with stage("node costs"):
        reference = sample(subject.task, N_MEAN, config.seed + SEEDS["reference"])
        recorded = mean_outputs(subject, reference, output_hooks(node_outputs(subject, graph)), run.rows)  # once
        costs = {n: Estimate(*mean_se(v)) for n, v in node_costs(
            subject, graph, tokens, reference, run.metric, rows=run.rows, recorded=recorded, clean=run.full,
            progress=lambda p: _bar(p, "node costs")).items()}  # fmt: skip
    with stage("node search"):
        if run.named is not None:
            nodes, added = graph.nodes(run.named), {}
        else:
            def faithful(c, ns):
                found = faithfulness(scored[c][0], among(graph, ns), run.plateau, run.full)
                return Estimate(found.faithfulness, found.se)

            nodes, added = run.choose_nodes(costs, sorted(costs, key=lambda n: -costs[n][0]),
                                            run.edge_weights(scored, costs), run.mean_sufficiency(reference, recorded),
                                            faithful)  # fmt: skip
    within = set(run.named) if run.named is not None else set(among(graph, nodes))
    sizes = curve_sizes(len(graph.edges), config.curve_points)
    searches, kept_by, passes, runs = {}, {}, 0, 0
    for c in corruptions:
        searches[c], kept_by[c] = run.search(c, scored, within, sizes)
    for c in corruptions:
        runner, scorer = scored[c][:2]
        passes += runner.passes + (scorer.passes if scorer is not runner else 0)
        runs += runner.context_runs + (scorer.context_runs if scorer is not runner else 0)
    union = kept_union(graph.edges, kept_by)
    groups = graph.groups[graph.receivers[0].site] if graph.family == "standard" else {}
    at: dict = {n: {} for n in nodes}
    with stage("per-group node costs"):
        for g, positions in groups.items():  # where each node's output matters: ablated at one group's positions
            for n, v in node_costs(subject, graph, tokens, reference, run.metric, rows=run.rows, nodes=nodes,
                                   positions=positions, recorded=recorded, clean=run.full).items():  # fmt: skip
                at[n][g] = Estimate(*mean_se(v))
    with stage("held-out answers"):
        held = held_out_sample(run)[0]
        n_held = len(held)
        held_out = measure(subject, graph, held, union, nodes, corruptions, config.seed + SEEDS["held_out"], run.rows,
                           config.positions)  # fmt: skip
    with stage("replicate"):
        fresh = sample(subject.task, n_held, config.seed + SEEDS["replicate"])
        replicate = measure(
            subject, graph, fresh, union, nodes, corruptions, config.seed + SEEDS["replicate"], run.rows, config.positions
        )
    score_of = {}
    for c in reversed(corruptions):  # each edge's score under the first corruption whose circuit kept it
        score_of.update({s.edge: (s.score, s.se, c) for s in searches[c].edges})
    kept_edges = kept_edge_rows(union, kept_by, score_of)
    return run.result(
        nodes=nodes, node_roles=node_roles(kept_by, nodes, added, at), node_costs=costs, edges=kept_edges,
        searches=searches, held_out=held_out, replicate=replicate, n_held_out=n_held, n_mean_reference=N_MEAN,
        forward_passes=passes, context_runs=runs, interventions=run.interventions(), scoring_note=note)  # fmt: skip


# At the level of nodes ----------------------------------------------------------------------------------
# A circuit of nodes keeps every edge among them (and the embeddings and the output): ablating every other
# edge then equals setting each head and MLP outside it to its ablated value in one run (every receiver of a
# node outside sees its ablated value; what the nodes inside compute follows), so each answer is one exact
# run of the contexts, not one per receiver (tests check the equality on the shipped GPT-2).


class _NodeAnswers:
    """The node-level answers on one sample: the clean run's metric, and the circuit's metric with every other
    head and MLP at its value under a corruption or an ablation. A value from other contexts is recorded a
    part at a time, as the run reaches it (``node_ablated_values``): memory is one part's."""

    def __init__(self, run: _Discovery, tokens, seed: int, reference, recorded: dict, full: Tensor | None = None):
        self.run, self.tokens, self.seed, self.reference, self.recorded = run, tokens, seed, reference, recorded
        self._full = full
        self.context_runs = 0  # the contexts run by ``ablated``, counted (a resample's recorded ones too)
        self.plateau, self.bma = per_context_baselines(run.task, tokens, run.config.positions)
        self._other: dict = {}
        self._runs: dict = {}  # (ablated value, nodes) -> the metric: each run made once

    @property
    def full(self) -> Tensor:
        """The clean run's metric per context, run when first needed (a sample that only lends its contexts to
        another's resample ablation never needs it)."""
        if self._full is None:
            self._full = run_and_record(self.run.subject, self.tokens, [], self.run.metric, self.run.rows)[1]
        return self._full

    def source(self, c: str) -> tuple[Tensor, dict]:
        """Corruption ``c``'s contexts and the nodes' outputs on them: the reference and its mean (averaged),
        else the corruption's other context of each context and None (recorded part by part as runs need them)."""
        if CORRUPTIONS[c].averaged:
            return self.reference, self.recorded
        if c not in self._other:
            self._other[c] = (CORRUPTIONS[c].other_contexts(self.run.task, self.tokens, self.seed), None)
        return self._other[c]

    def values(self, nodes, c: str) -> Tensor:
        """Per context, the metric with every head and MLP outside ``nodes`` at its value under corruption
        ``c`` (averaged: its mean over the reference contexts, as mean ablation, whatever its name; else its
        output on the corruption's other context of each context). Each run is made once."""
        averaged = CORRUPTIONS[c].averaged
        key = ("mean" if averaged else c, frozenset(nodes))
        if key not in self._runs:
            self._runs[key] = self.ablated(nodes, "mean" if averaged else "resample", *self.source(c))
        return self._runs[key]

    def ablated(self, nodes, ablation: str, reference, recorded) -> Tensor:
        run = self.run
        self.context_runs += len(self.tokens) * (2 if ablation == "resample" and recorded is None else 1)
        return node_ablated_values(run.subject, run.graph, self.tokens, nodes, ablation, reference, run.metric,
                                   rows=run.rows, recorded=recorded)  # fmt: skip

    def share(self, values: Tensor) -> Estimate:
        return Estimate(*ratio_se(self.plateau - values, self.plateau - self.full))

    def measurement(self, nodes, other: "_NodeAnswers", circuit_values=None) -> Measurement:
        """Faithfulness under each corruption, sufficiency with the rest mean-ablated (the reference's
        mean) and resampled (each context paired with ``other``'s sample, fresh contexts of the task).
        ``circuit_values(c)``: the circuit's metric per context under corruption ``c`` where its edges are not
        every edge among its nodes (pruned); by default ``values(nodes, c)``."""
        runs = [("faithfulness", c) for c in self.run.corruptions] + [("sufficiency", a) for a in NODE_ABLATIONS]
        faithful = circuit_values or partial(self.values, nodes)
        got = {}
        for what, name in _bar(runs, f"answers on {len(self.tokens)} contexts"):
            if what == "faithfulness":
                values = faithful(name)
            elif name == "resample":
                values = self.ablated(nodes, "resample", other.tokens, None)
            else:  # "mean": mean ablation, made once with an averaged corruption (the same run)
                values = self.values(nodes, name)
            got[(what, name)] = self.share(values)
        shares = {c: got[("faithfulness", c)] for c in self.run.corruptions}
        mean, resample = got[("sufficiency", "mean")], got[("sufficiency", "resample")]
        progress = Estimate(*ratio_se(self.plateau - self.full, self.plateau - self.bma))
        return Measurement(len(self.tokens), shares, progress, self.full.mean().item(),
                           {"mean": mean, "resample": resample})  # fmt: skip


def _node_attribution_in_parts(run: _Discovery, means: dict, search: _NodeAnswers) -> dict[str, dict]:
    """Per head and MLP, per search context, its first-order cost (``node_attribution``) when set to its mean
    (``"mean"``) and, per corruption that is not averaged, to its output on the corruption's other context
    (by the corruption's name), ``{key: {node: [n_contexts]}}``. A part of ``run.rows`` contexts at a time (a
    pass with gradients, and the other contexts' outputs recorded), so that memory is one part's."""
    subject, graph, hooks = run.subject, run.graph, output_hooks(node_outputs(run.subject, run.graph))
    others = [c for c in run.corruptions if not CORRUPTIONS[c].averaged]
    parts: dict = {"mean": [], **{c: [] for c in others}}
    for i in _bar(range(0, len(run.tokens), run.rows), f"node attribution, {run.rows} contexts a part"):
        part = slice(i, i + run.rows)
        clean, grads = output_grads(subject, graph, run.tokens[part], run.metric)
        parts["mean"].append(node_attribution(subject, graph, clean, grads, means))
        for c in others:
            value = record_outputs(subject, search.source(c)[0][part], hooks, run.rows)
            parts[c].append(node_attribution(subject, graph, clean, grads, value))
        # freed before the next part's pass, not while it runs: else the memory grew part by part (fragments)
        del clean, grads
        value = None
    return {k: {n: torch.cat([p[n] for p in v]) for n in v[0]} for k, v in parts.items()}


def _ablated_sources(run: _Discovery, tokens, seed: int, keep: set) -> tuple[dict, dict]:
    """Per corruption, its other context of each of ``tokens`` (drawn for all of them at once: the same draw as
    one pass's), and for an averaged corruption the senders' (of ``keep``) writes' mean over those, ``{(node,
    site): [1, pos, D]}``, summed in float64 a part of ``run.rows`` contexts at a time."""
    subject, graph, n = run.subject, run.graph, len(tokens)
    other = {c: CORRUPTIONS[c].other_contexts(run.task, tokens, seed) for c in run.corruptions}
    means: dict = {}
    for c in [c for c in run.corruptions if CORRUPTIONS[c].averaged]:
        sums: dict = {}
        for i in _bar(range(0, n, run.rows), f"the senders' means under {c}"):
            for k, v in sender_writes(subject, graph, other[c][i : i + run.rows], keep=keep)[0].items():
                part = v.double().sum(0, keepdim=True)
                sums[k] = (part + sums[k][0] if k in sums else part, v.dtype)
        means[c] = {k: (total / n).to(dtype) for k, (total, dtype) in sums.items()}
    return other, means


def _source(run: _Discovery, c: str, sources: tuple[dict, dict], part: slice, keep: set) -> dict:
    """Corruption ``c``'s ablated values of the senders of ``keep`` on the contexts ``part`` (``_ablated_sources``)."""
    other, means = sources
    return means[c] if c in means else sender_writes(run.subject, run.graph, other[c][part], keep=keep)[0]


def _edge_attribution_in_parts(run: _Discovery, keep: set, edges: list[Edge]) -> dict[str, EdgeScores]:
    """Per corruption, EAP of ``edges`` (among the nodes ``keep``) on each search context, ``[edge, context]``:
    the gradient at the clean run (the first corruption's runner's, shared) times each sender's change. A part of
    ``run.rows`` contexts at a time, the senders' writes of ``keep`` only, so that memory is one part's (the
    corruptions' values: ``_ablated_sources``)."""
    sources = _ablated_sources(run, run.tokens, run.config.seed, keep)
    values: dict = {c: [] for c in run.corruptions}
    for i in _bar(range(0, len(run.tokens), run.rows), f"edge scores among the nodes, {run.rows} contexts a part"):
        part = slice(i, i + run.rows)
        clean = sender_writes(run.subject, run.graph, run.tokens[part], keep=keep)
        grads = None
        for c in run.corruptions:
            runner = Runner(run.subject, run.graph, run.tokens[part], _source(run, c, sources, part, keep), run.metric,
                            clean=clean, rows=run.rows)  # fmt: skip
            grads = input_grads(runner, edges=edges) if grads is None else grads
            values[c].append(attribution(runner, grads, edges).values)
    return {c: EdgeScores(edges, torch.cat(v, 1)) for c, v in values.items()}


def sub_graph(graph: Graph, keep: set, edges: list[Edge]) -> Graph:
    """``graph`` restricted to the nodes ``keep`` (their senders and receivers) and ``edges`` among them."""
    return Graph([s for s in graph.senders if s.node in keep], [r for r in graph.receivers if r.node in keep],
                 graph.groups, list(edges), graph.family)  # fmt: skip


def pruning_work(run: _Discovery, sub: Graph) -> float:
    """FLOPs of pruning the edges of a circuit of nodes (``_pruned``), counted as ``edge_level_work`` counts the
    searches: per corruption, the top-n bisection's steps and the circuit, each at most one run of the search
    contexts per receiver of ``sub`` and per level, and one more; the kept senders' writes, two runs."""
    evaluations = len(sub.edges).bit_length() + 1
    runs = len(sub.receivers) + len({r.level for r in sub.receivers}) + 1
    return len(run.corruptions) * (evaluations * runs + 2) * run.pass_flops


def _outside_values(run: _Discovery, nodes, c: str, tokens, other, reference_means: dict) -> list[Intervention]:
    """Every head and MLP outside ``nodes`` at its value under corruption ``c`` on ``tokens``: its mean over
    the reference (averaged), else its output on ``other`` (each context's other context)."""
    by_hook = outside(run.subject, run.graph, nodes)
    if CORRUPTIONS[c].averaged:
        return outside_interventions(by_hook, "mean", reference_means)
    return outside_interventions(by_hook, "resample", record_outputs(run.subject, other, sorted(by_hook), run.rows))


def _pruned(run: _Discovery, nodes, sub: Graph, scores: dict, reference_means: dict) -> dict[str, tuple]:
    """Per corruption, the edges of a circuit of nodes that its search keeps (``--search``, on the search
    contexts): a Runner on the sub-graph of the nodes, every head and MLP outside them held at its value under
    the corruption in every pass (as the node-level answers hold them), the edges ordered by their EAP scores;
    an edge ablated carries its sender's value under the corruption. ``{corruption: (edges kept, their
    faithfulness on the search contexts)}``."""
    keep = {s.node for s in sub.senders} | {r.node for r in sub.receivers}
    sources = _ablated_sources(run, run.tokens, run.config.seed, keep)
    kept = {}
    for c in _bar(run.corruptions, "edges pruned among the nodes"):
        base = _outside_values(run, nodes, c, run.tokens, sources[0][c], reference_means)
        runner = Runner(run.subject, sub, run.tokens, _source(run, c, sources, slice(None), keep), run.metric,
                        rows=run.rows, base=base)  # fmt: skip
        stats = scores[c].with_se()
        chosen = SEARCHES[run.config.search].choose(runner, {e: stats[e][0] for e in sub.edges},
                                                    ranked(stats, run.config.min_z), run.config, run.plateau, run.full)  # fmt: skip
        found = faithfulness(runner, chosen, run.plateau, run.full)
        kept[c] = (chosen, Estimate(found.faithfulness, found.se))
    return kept


def _pruned_values(run: _Discovery, answers: _NodeAnswers, nodes, sub: Graph, kept: list[Edge], c: str) -> Tensor:
    """Per context of ``answers``' sample, the metric of the pruned circuit ``kept`` under corruption ``c``: every
    head and MLP outside ``nodes`` at its value under ``c``, every edge among them not in ``kept`` ablated. A
    part of ``run.rows`` contexts at a time."""
    keep = {s.node for s in sub.senders} | {r.node for r in sub.receivers}
    sources = _ablated_sources(run, answers.tokens, answers.seed, keep)
    values = []
    for i in range(0, len(answers.tokens), run.rows):
        part = slice(i, i + run.rows)
        base = _outside_values(run, nodes, c, answers.tokens[part], sources[0][c][part], answers.recorded)
        runner = Runner(run.subject, sub, answers.tokens[part], _source(run, c, sources, part, keep), run.metric,
                        rows=run.rows, base=base)  # fmt: skip
        values.append(runner.keep_only_values(kept))
    return torch.cat(values)


def _node_measurement(run: _Discovery, this: _NodeAnswers, other: _NodeAnswers, nodes, sub: Graph,
                      pruned: list[Edge] | None) -> Measurement:  # fmt: skip
    """The node-level answers on ``this`` sample (``other``: the resample's), the faithfulness that of the edges
    ``pruned`` where the circuit's edges were pruned (else every edge among the nodes)."""
    return this.measurement(nodes, other, None if pruned is None else partial(_pruned_values, run, this, nodes, sub, pruned))


def _node_circuit(run: _Discovery, why: str | None) -> CircuitResult:
    """``discover`` at the level of nodes: heads and MLPs ranked by attribution (their mean ablation alone
    to first order, one backward pass), the first ``exact_nodes`` measured exactly, chosen as
    ``choose_nodes`` does with node-level runs; the edges among them scored by EAP and pruned by the search
    (``_pruned``) where ``pruning_work`` fits what the budget leaves, else every one kept; the answers on
    held-out and replicate samples, exact runs of the contexts a part at a time, the replicate's only where its
    work (``node_answers_work``) fits what the budget leaves. Each stage's work is counted into ``run.work``."""
    subject, graph, config, stage = run.subject, run.graph, run.config, run.stages
    tokens, hooks = run.tokens, output_hooks(node_outputs(subject, graph))
    with stage("node attribution"):
        reference = sample(subject.task, N_MEAN_NODES, config.seed + SEEDS["reference"])
        recorded = means = mean_outputs(subject, reference, hooks, run.rows,  # mean ablation reads only the mean
                                        progress=lambda p: _bar(p, f"the means over {len(reference)} reference contexts"))
        search = _NodeAnswers(run, tokens, config.seed, reference, recorded, full=run.full)
        per_context = _node_attribution_in_parts(run, means, search)
        estimate = {n: Estimate(*mean_se(v)) for n, v in per_context["mean"].items()}
        by_corruption = {}
        for c in run.corruptions:
            att = {n: v.mean().item() for n, v in per_context["mean" if CORRUPTIONS[c].averaged else c].items()}
            by_corruption[c] = sorted(att, key=lambda n: -abs(att[n]))
    ranked_nodes = sorted(estimate, key=lambda n: -abs(estimate[n].value))
    exact = [n for n in ranked_nodes[: exact_nodes(subject, config)] if estimate[n].value != 0 or estimate[n].se != 0]
    with stage("node costs"):
        costs = {n: Estimate(*mean_se(v)) for n, v in node_costs(
            subject, graph, tokens, reference, run.metric, rows=run.rows, nodes=exact, recorded=recorded,
            clean=run.full, progress=lambda p: _bar(p, "node costs")).items()} if exact else {}  # fmt: skip
    by_cost = sorted(costs, key=lambda n: -costs[n][0]) + [n for n in ranked_nodes if n not in costs]
    with stage("node search"), progress(None, "circuit: node search, a run per check of the nodes so far") as bar:
        def checked(c: str, ns) -> Estimate:  # shown as it goes: each check is a run of the search contexts
            share = search.share(search.values(ns, c))
            bar.update()
            bar.set_postfix(nodes=len(ns), corruption=c, share=f"{share.value:.3f} +- {share.se:.3f}")
            return share

        if run.named is not None:
            nodes, added = graph.nodes(run.named), {}
        else:
            before = search.context_runs
            nodes, added = run.choose_nodes(costs, by_cost, by_corruption, partial(checked, "mean"), checked,
                                            within_se=2)  # fmt: skip
            run.work["node search (counted as it ran)"] = (search.context_runs - before) * flops_per_context(subject)
    edges = among(graph, nodes)
    keep = set(nodes) | {n for n in graph.node_order if n.is_end}
    # counted as the clean run, the pass with gradients (3 runs) and each corruption's values (a run each)
    run.work["edge scores (eap, among the nodes)"] = (4 + len(run.corruptions)) * run.pass_flops
    with stage("edge scores (eap, among the nodes)"):
        scores = _edge_attribution_in_parts(run, keep, edges)
    sub = sub_graph(graph, keep, edges)
    prune_work, left = pruning_work(run, sub), config.exact_budget * TERA - sum(run.work.values())
    if run.named is None and prune_work <= left:
        with stage("edges pruned among the nodes"):
            pruned = _pruned(run, nodes, sub, scores, recorded)
        run.work["edges pruned among the nodes"] = prune_work
        prune_note = (f"the edges among them pruned by the {config.search} search on the search contexts (every other "
                      f"head and MLP held at its ablated value; {prune_work / TERA:.2g} TFLOP counted)")  # fmt: skip
    else:
        pruned = None
        prune_note = ("the circuit's edges are every edge among its nodes" + (
            "" if run.named is not None else f" (pruning them is counted at {prune_work / TERA:.2g} TFLOP, beyond "
            f"what --exact-budget leaves, {max(left, 0) / TERA:.2g})"))  # fmt: skip
    searches, kept_by = {}, {}
    for c in run.corruptions:
        stats = scores[c].with_se()
        kept_by[c], found = pruned[c] if pruned else (edges, search.share(search.values(nodes, c)))
        rows_ = [ScoredEdge(e, *stats[e]) for e in sorted(kept_by[c], key=lambda e: -abs(stats[e][0]))]
        searches[c] = CorruptionSearch(
            c, rows_, sum(abs(stats[e][0]) <= 2 * stats[e][1] for e in kept_by[c]),
            sum(abs(x) > config.min_z * se for x, se in stats.values()), found, [], None,
            [ScoredEdge(e, *stats[e]) for e in edges], input_sums(scores[c]))  # fmt: skip
    union = kept_union(edges, kept_by)
    with stage("held-out answers"):
        held_tokens, held_full = held_out_sample(run)  # its clean run counted below, in the answers' work
        n_held = len(held_tokens)
        run.work["held-out answers"] = answers = node_answers_work(subject, config, n_held, sub if pruned else None)
        held = _NodeAnswers(run, held_tokens, config.seed + SEEDS["held_out"], reference, recorded, full=held_full)
        fresh = _NodeAnswers(run, sample(subject.task, n_held, config.seed + SEEDS["replicate"]),
                             config.seed + SEEDS["replicate"], reference, recorded)  # fmt: skip
        held_out = _node_measurement(run, held, fresh, nodes, sub, union if pruned else None)
    left = config.exact_budget * TERA - sum(run.work.values())
    replicate_note = None if answers <= left else (
        f"the replicate's {answers / TERA:.2g} TFLOP are beyond what --exact-budget leaves ({max(left, 0) / TERA:.2g} "
        f"TFLOP of {config.exact_budget:g}); --exact-budget {math.ceil((config.exact_budget * TERA - left + answers) / TERA)} "
        "or more runs it")  # fmt: skip
    replicate = None
    if replicate_note is None:
        run.work["replicate"] = answers
        with stage("replicate"):
            replicate = _node_measurement(run, fresh, held, nodes, sub, union if pruned else None)
    score_of = {}
    for c in reversed(run.corruptions):  # each edge's score under the first corruption whose circuit kept it
        stats = scores[c].with_se()
        score_of.update({e: (*stats[e], c) for e in kept_by[c]})
    kept_edges = kept_edge_rows(union, kept_by, score_of)
    interventions = [description(h, "mean" if CORRUPTIONS[c].averaged else "patch",
                                 f"every head / MLP outside the circuit: {CORRUPTIONS[c].words}")
                     for c in run.corruptions for h in hooks]  # fmt: skip
    interventions += [description(h, kind, f"every head / MLP outside the circuit: {NODE_ABLATIONS[a]}")
                      for a, kind in (("mean", "mean"), ("resample", "patch")) for h in hooks]  # fmt: skip
    note = (f"{why or 'asked for by --level nodes'}. Heads and MLPs are ranked by attribution (the first-order "
            f"cost of each one's mean ablation, one backward pass), the first {len(exact)} measured exactly (as many "
            f"runs as half of --exact-budget allows, at most {NODES_EXACT}); nodes are added while a share is below "
            f"the target by more than 2 standard errors; the edges among them are scored by EAP; {prune_note}; each "
            "answer is an exact run (every other head and MLP at its ablated value, the same as ablating every other "
            "edge)")  # fmt: skip
    roles = {n: dataclasses.replace(r, side="side not measured (a circuit of nodes)")
             for n, r in node_roles(kept_by, nodes, added, {}).items()}  # every edge among them: both sides  # fmt: skip
    return run.result(
        nodes=nodes, node_roles=roles, node_costs=costs, edges=kept_edges,
        searches=searches, held_out=held_out, replicate=replicate, replicate_note=replicate_note, n_held_out=n_held,
        n_mean_reference=N_MEAN_NODES, interventions=interventions, level="nodes", level_note=note, node_attribution=estimate, forward_passes=None,
        context_runs=None, edges_pruned=pruned is not None)  # fmt: skip
