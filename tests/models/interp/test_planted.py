"""Issue 51: circuit discovery on a model whose circuit is known in advance. The shipped 2-layer GPT-2 is planted
in a 4-layer, 12-head, width-96 GPT-2 (``bench.deepened`` with ``noise=1``): its layers at 0 and 3, its 8 heads
a layer in the first 8 of 12, and every other head and MLP neuron (the distractors, 32 heads and 2 MLPs' worth
beside the planted layers' extra heads and neurons) reading and writing with GPT-2's initial weights. The
default circuit (level auto, which counts the edge-level search beyond the budget here and chooses nodes) must
choose planted heads (precision over 70%), find the small model's costliest heads (measured on the small model
by hand, not by the suite), and report a sufficiency that an independent forward (plain torch hooks on the
Hugging Face modules) reproduces within 2 standard errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import models
from bench.deepened import deepen, planted_nodes
from bench.planted import audited_heads, by_hand_values, evaluate, roc_auc
from models import STANDARD_CHECKPOINT
from models.interp.circuit import CircuitConfig

AT = (0, 3)
CONFIG = CircuitConfig(n_held_out=128)  # the defaults but the held-out size (quick tier; 25 s of CPU)


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    return deepen(STANDARD_CHECKPOINT, tmp_path_factory.mktemp("planted"), n_layer=4, n_head=12, n_embd=96,
                  vocab_size=1000, at=AT, noise=1.0)  # fmt: skip


def test_the_distractors_write_but_the_planted_model_still_computes_the_small_ones_task(planted):
    """The distractors are not silent (the planted model's log-probs differ from the small model's), and the
    small model's prediction survives them (NLL within 0.01 nats)."""
    small, big = models.load_subject("standard"), models.load_subject(str(planted))
    tokens = small.task.sample(64, torch.Generator().manual_seed(0))[0]
    a, b = small.log_probs(tokens), big.log_probs(tokens)
    assert (a - b).abs().max() > 1e-4
    nll = lambda lp: -lp.gather(-1, tokens[:, -lp.shape[1] :].unsqueeze(-1)).mean()  # noqa: E731
    assert abs(nll(a) - nll(b)) < 0.01
    assert planted_nodes(STANDARD_CHECKPOINT, 4, AT) == [f"L{i}H{j}" for i in AT for j in range(8)] + ["MLP0", "MLP3"]


def test_the_default_circuit_finds_the_planted_heads_and_its_sufficiency_is_reproduced_by_hand(planted):
    audited = audited_heads(Path(STANDARD_CHECKPOINT), n_contexts=256)
    assert len(audited) >= 5
    row = evaluate(planted, Path(STANDARD_CHECKPOINT), AT, audited, CONFIG)
    assert row["level"] == "nodes"  # counted beyond the budget at the level of edges
    assert row["precision"] > 0.7, row["chosen_heads"]
    assert row["recall_top5"] == 1.0, (audited[:5], row["chosen_heads"])
    assert row["auc"] > 0.9
    assert abs(row["sufficiency"] - row["sufficiency_by_hand"]) < 2 * row["sufficiency_se"]


def test_the_hand_forward_and_the_auc_are_what_they_say():
    """by_hand_values with nothing ablated is the suite's clean metric (a forward without TransformerLens), and
    roc_auc is the Mann-Whitney probability on a case counted by hand."""
    from transformers import GPT2LMHeadModel

    from probes.metrics import per_context_nll

    subject = models.load_subject("standard")
    hf = GPT2LMHeadModel.from_pretrained(str(STANDARD_CHECKPOINT)).eval()
    tokens = subject.task.sample(16, torch.Generator().manual_seed(3))[0]
    got = by_hand_values(hf, subject, tokens, [], tokens)
    assert torch.allclose(got, per_context_nll(subject.log_probs(tokens), tokens), atol=1e-5)
    # positives {a: 3, b: 1}, negatives {c: 2, d: 1}: a beats both, b ties d and loses to c -> (2 + 0.5) / 4
    assert roc_auc({"a": 3, "b": 1, "c": 2, "d": 1}, {"a", "b"}) == pytest.approx(0.625)


def test_a_pruned_circuit_that_keeps_every_edge_among_its_nodes_answers_as_the_circuit_of_nodes(planted):
    """The Runner that prunes edges inside a circuit of nodes (every head and MLP outside held at its ablated
    value in every pass, ``Runner(base=...)``) with no edge pruned gives, context by context, the node-level
    run (every other head and MLP at its ablated value, one run): two computations of the same circuit."""
    from models.interp.circuit import discovery
    from models.interp.circuit.nodes import mean_outputs, node_outputs, output_hooks

    subject = models.load_subject(str(planted))
    run = discovery._Discovery(subject, CircuitConfig(n_contexts=16, n_held_out=32, level="nodes"))
    nodes = [discovery.Node.parse(n) for n in planted_nodes(STANDARD_CHECKPOINT, 4, AT)]
    keep = set(nodes) | {n for n in run.graph.node_order if n.is_end}
    sub = discovery.sub_graph(run.graph, keep, discovery.among(run.graph, nodes))
    reference = discovery.sample(subject.task, 64, 5)
    means = mean_outputs(subject, reference, output_hooks(node_outputs(subject, run.graph)))
    answers = discovery._NodeAnswers(run, discovery.sample(subject.task, 24, 9), 9, reference, means)
    for c in run.corruptions:
        pruned = discovery._pruned_values(run, answers, nodes, sub, sub.edges, c)
        assert torch.allclose(pruned, answers.values(nodes, c), atol=2e-5), c
        fewer = discovery._pruned_values(run, answers, nodes, sub, sub.edges[: len(sub.edges) // 2], c)
        assert (fewer - pruned).abs().max() > 1e-3  # pruning half the edges changes the answer


def test_node_attribution_is_the_total_derivative_of_each_node_by_central_differences():
    """node_attribution's first-order cost of setting one node to another value, against central differences
    of the metric with that node's output moved by +-eps along the same change (plain hooks, every later head
    and MLP recomputed): the gradient must include every path through the later layers (a gradient taken at
    detached outputs kept only each node's direct path to the logits, and auto-circuit's EAP of nodes said so:
    `python -m bench.auto_circuit_nodes`)."""
    from functools import partial

    from models.interp.circuit import build_graph
    from models.interp.circuit.nodes import node_attribution, node_outputs, output_grads, record_outputs
    from probes.metrics import per_context_nll

    subject = models.load_subject("standard")
    graph = build_graph(subject)
    tokens = subject.task.sample(16, torch.Generator().manual_seed(4))[0]
    other = subject.task.sample(16, torch.Generator().manual_seed(5))[0]
    outputs = node_outputs(subject, graph)
    clean, grads = output_grads(subject, graph, tokens, per_context_nll)
    value = record_outputs(subject, other, sorted({h for h, _ in outputs.values()}))
    attribution = node_attribution(subject, graph, clean, grads, value)
    eps = 1e-2
    for name in ("L0H7", "L0H3", "MLP0", "L1H2"):
        node = next(n for n in outputs if str(n) == name)
        hook, head = outputs[node]
        change = (value[hook] - clean[hook]) if head is None else (value[hook] - clean[hook])[:, :, head]

        def moved(x, hook, sign):
            x = x.clone()
            if head is None:
                x += sign * eps * change
            else:
                x[:, :, head] += sign * eps * change
            return x

        up, down = (per_context_nll(subject.log_probs(tokens, [(hook, partial(moved, sign=s))]), tokens) for s in (1, -1))
        numeric = ((up - down) / (2 * eps)).mean().item()
        assert attribution[node].mean().item() == pytest.approx(numeric, rel=0.03, abs=1e-4), name
