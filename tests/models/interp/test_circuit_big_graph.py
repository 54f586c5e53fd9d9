"""Circuit discovery on a graph too big for exact edge patching (issue 44), on a scaled-down stand-in of a
GPT-2-small-shaped model: the shipped 2-layer GPT-2 placed in a 4-layer, 8-head GPT-2 with a 1,000-token
vocabulary whose other two layers are identity layers (``bench.deepened``: they read with random weights and
write nothing). It computes what the shipped model computes, so its circuit is the shipped model's: at the level
of edges with the edges ranked by EAP-IG, and at the level of nodes (every edge among them), whose answers rest on
the equality of one node-level run with ablating every other edge, checked on the shipped model."""

from __future__ import annotations

import math

import pytest
import torch

import models
from bench.deepened import deepen
from models import STANDARD_CHECKPOINT
from models.interp.circuit import (
    CircuitConfig,
    Node,
    Runner,
    among,
    build_graph,
    discover,
    eap_ig_scores,
    eap_scores,
    mean_writes,
    node_ablated_values,
    other_contexts,
    sender_writes,
    source_writes,
)

CONFIG = dict(n_contexts=16, n_held_out=32, curve_points=1, ig_steps=2, corruptions=("demonstrations",))


def placed(label: str) -> str:
    """A node of the shipped model as the stand-in has it: layers 0 and 1 at 0 and 2."""
    n = Node.parse(label)
    return label if n.is_end else str(Node(n.kind, {0: 0, 1: 2}[n.layer], n.head))


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    folder = deepen(STANDARD_CHECKPOINT, tmp_path_factory.mktemp("stand_in"), n_layer=4, n_head=8, n_embd=64,
                    vocab_size=1000, at=(0, 2))  # fmt: skip
    return models.load_subject(str(folder))


def test_the_stand_in_computes_what_the_shipped_model_computes(stand_in):
    small = models.load_subject("standard")
    tokens = small.task.sample(32, torch.Generator().manual_seed(0))[0]
    assert len(build_graph(stand_in).node_order) == 2 + 4 * 8 + 4 + 1  # embeddings, 32 heads, 4 MLPs, output
    assert torch.allclose(stand_in.log_probs(tokens), small.log_probs(tokens), atol=1e-4)


def test_beyond_the_budget_edges_are_ranked_by_eap_ig_and_the_circuit_is_judged_by_exact_runs(stand_in):
    """With --exact-budget 0 the summary and the JSON say that exact patching was replaced by EAP-IG, and
    why; every edge's score is EAP-IG's on the search contexts (computed here by eap_ig_scores itself);
    the identity layers' heads and MLPs, which write nothing, cost exactly 0 and are not in the circuit; and
    the circuit is the shipped 2-layer model's under the same ranking, its layers 0 and 1 at 0 and 2, with
    the same held-out answers (exact runs of the circuit: the two models compute the same to 1e-5)."""
    from analyses import circuit

    found = discover(stand_in, CircuitConfig(exact_budget=0, level="edges", **CONFIG))
    r = found.to_dict()
    assert r["scored_with"] == "eap-ig" and "beyond --exact-budget 0 TFLOP" in r["scoring_note"]
    assert "scored with EAP-IG: exact edge patching of the" in circuit.summary(r)
    graph = build_graph(stand_in)
    tokens = stand_in.task.sample(CONFIG["n_contexts"], torch.Generator().manual_seed(0))[0]
    runner = Runner(stand_in, graph, tokens, source_writes(stand_in, graph, tokens, "demonstrations", 0))
    means = eap_ig_scores(runner, steps=CONFIG["ig_steps"]).means()
    assert all(e["score"] == pytest.approx(means[graph.edges[i]], abs=1e-9) for i, e in enumerate(r["all_edges"]))
    idle = [n for n in graph.node_order if not n.is_end and n.layer in (1, 3)]
    assert all(r["node_costs"][str(n)]["cost"] == 0 for n in idle) and not set(map(str, idle)) & set(r["nodes"])

    small = discover(models.load_subject("standard"), CircuitConfig(method="eap-ig", **CONFIG)).to_dict()
    assert r["nodes"] == [placed(n) for n in small["nodes"]]
    assert {(e["sender"], e["receiver"], e["input"], e["group"]) for e in r["edges"]} == {
        (placed(e["sender"]), placed(e["receiver"]), e["input"], e["group"]) for e in small["edges"]}  # fmt: skip
    for key in ("faithfulness_demonstrations", "sufficiency_mean", "sufficiency_resample", "progress"):
        assert r["held_out"][key] == pytest.approx(small["held_out"][key], abs=1e-4)


def test_the_budget_is_compared_with_the_counted_work_of_exact_patching(stand_in):
    """Exact patching's work is its runs of the contexts (an edit per sender and site, one per edge) times the
    FLOPs of one run (counted from the weights); within the budget the edges are scored exactly, beyond it by
    EAP-IG."""
    from models.interp.circuit import discovery
    from models.interp.circuit.exact import copy_runs

    run = discovery._Discovery(stand_in, CircuitConfig(**CONFIG))
    graph = build_graph(stand_in)
    edits = {(e.sender, graph.receiver_of(e).site) for e in graph.edges if graph.receiver_of(e).capture}
    assert copy_runs(graph) == len(edits) + len(graph.edges) and run.pass_flops > 0
    estimate = copy_runs(graph) * run.pass_flops / 1e12  # teraFLOPs
    assert run.method() == ("exact", None)
    for budget, method in ((estimate * 1.01, "exact"), (estimate * 0.99, "eap-ig")):
        run.config = CircuitConfig(**CONFIG, exact_budget=budget)
        assert run.method()[0] == method


@pytest.mark.parametrize("corruption", ["demonstrations", "mean"])
def test_a_circuit_of_nodes_answers_as_ablating_every_edge_outside_it(corruption):
    """The level of nodes rests on one equality: with every edge among the nodes kept (and the embeddings'
    and the output's), ablating every other edge (``Runner.keep_only_values``, ACDC's semantics, a run per
    receiver) equals one run with every head and MLP outside the nodes at its ablated value: its output on
    the corruption's other context, or its mean over the same reference contexts."""
    subject = models.load_subject("standard")
    graph = build_graph(subject)
    tokens = subject.task.sample(24, torch.Generator().manual_seed(5))[0]
    nodes = ["L0H0", "L0H4", "MLP0", "L1H2", "L1H5", "MLP1"]
    if corruption == "mean":
        reference = subject.task.sample(40, torch.Generator().manual_seed(6))[0]
        source = mean_writes(sender_writes(subject, graph, reference)[0])
        ablation = "mean"
    else:
        reference = other_contexts(subject.task, tokens, corruption, 3)
        source = source_writes(subject, graph, tokens, corruption, 3)
        ablation = "resample"
    edges = Runner(subject, graph, tokens, source).keep_only_values(among(graph, nodes))
    one_run = node_ablated_values(subject, graph, tokens, nodes, ablation, reference)
    clean = Runner(subject, graph, tokens, source).clean_values
    assert (edges - clean).abs().max() > 0.05  # the ablation moves the metric: the equality says something
    assert torch.allclose(one_run, edges, atol=2e-5), (one_run - edges).abs().max()


def test_the_nodes_of_the_stand_in_are_the_placed_layers_and_answer_as_the_shipped_model(stand_in):
    """At the level of nodes, on the stand-in: the identity layers' heads and MLPs, which write nothing, are
    estimated at exactly 0 and are not in the circuit; the circuit is the shipped model's found the same
    way, its layers 0 and 1 at 0 and 2, with the same answers (the two compute the same to 1e-5); the edges
    are among the nodes (pruned by the search where the budget allows), each scored by EAP (computed here by
    eap_scores itself); with every edge among them, faithfulness under mean is mean-ablation sufficiency, one
    run; and the summary says it is a circuit of nodes."""
    from analyses import circuit

    config = dict(CONFIG, corruptions=("demonstrations", "mean"))
    r = discover(stand_in, CircuitConfig(level="nodes", **config)).to_dict()
    graph = build_graph(stand_in)
    idle = [str(n) for n in graph.node_order if not n.is_end and n.layer in (1, 3)]
    assert all(r["node_attribution"][n] == {"cost": 0.0, "se": 0.0} for n in idle)
    assert not set(idle) & set(r["nodes"]) and not set(idle) & set(r["node_costs"])
    inside = {(str(e.sender), str(e.receiver), e.input, e.group) for e in among(graph, r["nodes"])}
    assert r["level"] == "nodes" and {(e["sender"], e["receiver"], e["input"], e["group"]) for e in r["edges"]} <= inside
    assert r["edges_pruned"] or len(r["edges"]) == len(inside)  # within the budget the top-n search prunes them
    tokens = stand_in.task.sample(CONFIG["n_contexts"], torch.Generator().manual_seed(0))[0]
    runner = Runner(stand_in, graph, tokens, source_writes(stand_in, graph, tokens, "demonstrations", 0))
    means = eap_scores(runner).means()
    scored = [e for e in r["edges"] if e["scored_by"] == "demonstrations"]  # each its first finder's score
    assert scored and all(e["score"] == pytest.approx(means[_edge(graph, e)], abs=1e-9) for e in scored)
    for m in (r["held_out"], r["replicate"]):  # every edge among the nodes: one run, mean-ablation sufficiency's
        assert (m["faithfulness_mean"] == m["sufficiency_mean"]) or r["edges_pruned"]
    assert "a circuit of nodes: asked for by --level nodes" in circuit.summary(r)

    small = discover(models.load_subject("standard"), CircuitConfig(level="nodes", **config)).to_dict()
    assert r["nodes"] == [placed(n) for n in small["nodes"]]
    for key in ("faithfulness_demonstrations", "sufficiency_mean", "sufficiency_resample", "progress"):
        assert r["held_out"][key] == pytest.approx(small["held_out"][key], abs=1e-4)


def _edge(graph, e: dict):
    return next(x for x in graph.edges if (str(x.sender), str(x.receiver), x.input, x.group)
                == (e["sender"], e["receiver"], e["input"], e["group"]))  # fmt: skip


def test_auto_chooses_nodes_where_the_edge_level_search_is_counted_beyond_the_budget(stand_in):
    """auto: edges while the search at the level of edges (its scores, node costs, curves and searches) is
    counted within --exact-budget, nodes beyond it (the reason in the result); a level asked for is kept
    whatever the budget. The count: exact patching's runs (an edit per sender and site, one per edge), one run
    per node and per node and group of positions, the mean reference, and per faithfulness measured (the curve's
    points, the bisection's steps, the circuit and its KL) one run per receiver and per level and one more."""
    from models.interp.circuit import discovery
    from models.interp.circuit.exact import copy_runs

    run = discovery._Discovery(stand_in, CircuitConfig(**CONFIG))
    graph, one = run.graph, run.pass_flops
    n = len(discovery.node_outputs(stand_in, graph))
    assert n == 4 * 8 + 4
    levels = len({r.level for r in graph.receivers})
    evaluations = CONFIG["curve_points"] + len(graph.edges).bit_length() + 2
    want = (copy_runs(graph) * one + n * 3 * one + discovery.N_MEAN * one / CONFIG["n_contexts"]
            + evaluations * (len(graph.receivers) + levels + 1) * one)  # fmt: skip
    assert sum(discovery.edge_level_work(stand_in, graph, run.config).values()) == pytest.approx(want, rel=1e-12)
    for budget, level in ((want / 1e12 * 1.01, "edges"), (want / 1e12 * 0.99, "nodes")):
        run.config = CircuitConfig(**CONFIG, exact_budget=budget)
        got, why = run.level()
        assert got == level and (why is None) == (level == "edges")
        if why:
            assert f"counts {want / 1e12:.1f} TFLOP on the {CONFIG['n_contexts']} search contexts" in why
    run.config = CircuitConfig(**CONFIG, exact_budget=0, level="edges")
    assert run.level() == ("edges", None)


def test_the_method_and_level_do_not_depend_on_the_machine(stand_in, monkeypatch):
    """Issue 52: the choice between exact patching and EAP-IG came from a timed pass (the same command picked
    EAP-IG with 2 threads on a loaded machine, exact with 1). Now the work is counted: one run of the search
    contexts is 2 x the blocks' parameters x the positions x the contexts, against GPT-2's closed form from its
    config (a block: attention 4d^2 + 4d, MLP 2 d inner + inner + d, two LayerNorms 4d); a clock that runs 1000
    times slower changes no decision."""
    import time

    from models.interp.circuit import discovery

    cfg = stand_in.model.original_model.config
    d, inner = cfg.n_embd, cfg.n_inner or 4 * cfg.n_embd
    per_block = 4 * d * d + 4 * d + 2 * d * inner + inner + d + 4 * d
    run = discovery._Discovery(stand_in, CircuitConfig(**CONFIG))
    assert run.pass_flops == 2 * cfg.n_layer * per_block * stand_in.layout.n_positions * CONFIG["n_contexts"]
    decisions = (run.method(), run.level())
    monkeypatch.setattr(time, "process_time", lambda: 1000 * time.perf_counter())
    slow = discovery._Discovery(stand_in, CircuitConfig(**CONFIG))
    assert (slow.method(), slow.level()) == decisions and slow.pass_flops == run.pass_flops


def test_each_node_level_stage_runs_the_contexts_its_work_counts_and_the_replicate_waits_for_the_budget(
    stand_in, monkeypatch
):
    """Issue 51's budgets that hold: at the level of nodes, the held-out answers' and the replicate's work is
    counted before they run (``node_answers_work``: runs x contexts x the FLOPs of one context), the node search's
    as it runs; each equals the contexts the model is actually run on in that stage (every call of
    ``log_probs``, counted here) times the FLOPs of one. The replicate runs only where its work fits in what
    ``--exact-budget`` leaves; else the result says why, and the summary too."""
    from contextlib import contextmanager

    from analyses import circuit
    from models.interp.circuit import discovery
    from models.interp.memory import flops_per_context

    stage, ran = [None], {}
    entered = discovery.Stages.__call__

    @contextmanager
    def tracked(self, name):
        stage.append(name)
        with entered(self, name):
            yield
        stage.pop()

    log_probs = stand_in.log_probs

    def counted(tokens, *args, **kwargs):
        ran[stage[-1]] = ran.get(stage[-1], 0) + len(tokens)
        return log_probs(tokens, *args, **kwargs)

    monkeypatch.setattr(discovery.Stages, "__call__", tracked)
    monkeypatch.setattr(stand_in, "log_probs", counted)
    monkeypatch.setattr(discovery, "pruning_work", lambda run, sub: math.inf)  # every edge among the nodes: exact counts
    config = dict(CONFIG, corruptions=("demonstrations", "mean"))
    one = flops_per_context(stand_in)
    found = discover(stand_in, CircuitConfig(level="nodes", exact_budget=100, **config))
    assert not found.edges_pruned and found.replicate is not None
    for name in ("held-out answers", "replicate", "node search (counted as it ran)"):
        assert found.work[name] == pytest.approx(ran[name.split(" (")[0]] * one, rel=1e-12), name
    assert found.replicate.n_contexts == CONFIG["n_held_out"]

    ran.clear()  # a budget that holds everything but the replicate: the same circuit and held-out answers
    budget = sum(v for k, v in found.work.items() if k != "replicate") / 1e12
    tight = discover(stand_in, CircuitConfig(level="nodes", exact_budget=budget, **config))
    assert tight.replicate is None and "replicate" not in ran and "replicate" not in tight.work
    assert tight.held_out.to_dict() == found.held_out.to_dict() and tight.nodes == found.nodes
    r = tight.to_dict()
    assert r["replicate"] is None and "beyond what --exact-budget leaves" in r["replicate_note"]
    assert f"not re-measured on fresh contexts: {r['replicate_note']}" in circuit.summary(r)
