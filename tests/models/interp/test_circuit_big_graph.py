"""Circuit discovery on a graph too big for exact edge patching (issue 44), on a scaled-down stand-in of a
GPT-2-small-shaped model: the shipped 2-layer GPT-2 placed in a 4-layer, 8-head GPT-2 with a 1,000-token
vocabulary whose other two layers are identity layers (``bench.deepened``: they read with random weights and
write nothing). It computes what the shipped model computes, so its circuit is the shipped model's."""

from __future__ import annotations

import pytest
import torch

import models
from bench.deepened import deepen
from models import STANDARD_CHECKPOINT
from models.interp.circuit import CircuitConfig, Node, Runner, build_graph, discover, eap_ig_scores, source_writes

CONFIG = dict(n_contexts=16, n_held_out=32, curve_points=1, ig_steps=2, corruptions=("demonstrations",))


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

    found = discover(stand_in, CircuitConfig(exact_budget=0, **CONFIG))
    r = found.to_dict()
    assert r["scored_with"] == "eap-ig" and "beyond --exact-budget 0 s" in r["scoring_note"]
    assert "scored with EAP-IG: exact edge patching of the" in circuit.summary(r)
    graph = build_graph(stand_in)
    tokens = stand_in.task.sample(CONFIG["n_contexts"], torch.Generator().manual_seed(0))[0]
    runner = Runner(stand_in, graph, tokens, source_writes(stand_in, graph, tokens, "demonstrations", 0))
    means = eap_ig_scores(runner, steps=CONFIG["ig_steps"]).means()
    assert all(e["score"] == pytest.approx(means[graph.edges[i]], abs=1e-9) for i, e in enumerate(r["all_edges"]))
    idle = [n for n in graph.node_order if not n.is_end and n.layer in (1, 3)]
    assert all(r["node_costs"][str(n)]["cost"] == 0 for n in idle) and not set(map(str, idle)) & set(r["nodes"])

    small = discover(models.load_subject("standard"), CircuitConfig(method="eap-ig", **CONFIG)).to_dict()
    moved = {0: 0, 1: 2}

    def placed(label: str) -> str:
        n = Node.parse(label)
        return label if n.is_end else str(Node(n.kind, moved[n.layer], n.head))

    assert r["nodes"] == [placed(n) for n in small["nodes"]]
    assert {(e["sender"], e["receiver"], e["input"], e["group"]) for e in r["edges"]} == {
        (placed(e["sender"]), placed(e["receiver"]), e["input"], e["group"]) for e in small["edges"]}  # fmt: skip
    for key in ("faithfulness_demonstrations", "sufficiency_mean", "sufficiency_resample", "progress"):
        assert r["held_out"][key] == pytest.approx(small["held_out"][key], abs=1e-4)


def test_the_budget_is_compared_with_the_estimate_of_exact_patching_from_one_timed_pass(stand_in):
    """Exact patching's estimate is its runs of the contexts (an edit per sender and site, one per edge)
    times the CPU time of the clean run; within the budget the edges are scored exactly, beyond it by EAP-IG."""
    from models.interp.circuit import discovery
    from models.interp.circuit.exact import copy_runs

    run = discovery._Discovery(stand_in, CircuitConfig(**CONFIG))
    graph = build_graph(stand_in)
    edits = {(e.sender, graph.receiver_of(e).site) for e in graph.edges if graph.receiver_of(e).capture}
    assert copy_runs(graph) == len(edits) + len(graph.edges) and run.pass_s > 0
    estimate = copy_runs(graph) * run.pass_s
    assert run.method() == ("exact", None)
    for budget, method in ((estimate * 1.01, "exact"), (estimate * 0.99, "eap-ig")):
        run.config = CircuitConfig(**CONFIG, exact_budget=budget)
        assert run.method()[0] == method
