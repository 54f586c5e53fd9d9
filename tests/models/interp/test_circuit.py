"""models.interp.circuit: hooks that mean what they say (per family), exact edge patching and EAP-IG recover the
circuits known in advance (ROC AUC), EAP equals exact patching where the metric is linear in the patched
input, and single-edge scores add up where they must."""

from __future__ import annotations

import dataclasses
from functools import partial

import numpy as np
import pytest
import torch
from conftest import build_task
from constructed import transposed_subject, transposed_truth
from test_formats import hf_folder
from test_formats_pipelines import SPECIAL, write_nanogpt

import models
from models.interp.circuit import (
    CircuitConfig,
    Runner,
    build_graph,
    denoising_runner,
    discover,
    eap_ig_scores,
    eap_scores,
    exact_scores,
    other_contexts,
    per_context_nll,
    ratio_se,
    roc_auc,
    sender_writes,
    source_writes,
)
from models.interp.interventions import Intervention
from models.interp.subject import StandardSubject, load_subject, subject_of
from models.nets.hooked_transformer import HookedTransformer, HookedTransformerConfig
from probes import Layout, bma_predictive


def _grab_all(subject, tokens, names, extra=()):
    store = {}

    def grab(a, hook, n):
        store[n] = a.detach().clone()

    lp = subject.log_probs(tokens, [*extra, *((n, lambda a, hook, n=n: grab(a, hook, n)) for n in names)])
    return lp, store


def _subjects(tmp_path):
    task = build_task(n_examples=3, seq_len=4)
    theorem1 = subject_of(models.theorem1_model(task.pi, 3, 4, 5.0), task, None, "theorem1", "0")
    hf, _, _ = hf_folder(tmp_path, task)
    nano, _, _ = write_nanogpt(tmp_path / "nano", task, SPECIAL)
    return {"theorem1": theorem1, "default": load_subject("default"), "bridge": load_subject(hf),
            "nanogpt": load_subject(nano)}  # fmt: skip


@pytest.fixture(scope="module")
def subjects(tmp_path_factory):
    return _subjects(tmp_path_factory.mktemp("circuit"))


@pytest.mark.parametrize("family", ["theorem1", "default", "bridge", "nanogpt"])
def test_every_receiver_edit_moves_only_its_own_input_at_its_positions(subjects, family):
    """Adding a change at a receiver's site at one position moves its captured activation (its head's
    q / k / v, the MLP's output, the copyer's copy) and, for a position-wise input, only at that position."""
    subject = subjects[family]
    subject.model.eval()
    graph = build_graph(subject)
    tokens, _ = subject.task.sample(3, torch.Generator().manual_seed(0))
    captures = sorted({r.capture for r in graph.receivers if r.capture})
    _, clean = _grab_all(subject, tokens, captures + sorted({r.site for r in graph.receivers}))
    g = torch.Generator().manual_seed(1)
    H = subject.task.seq_len
    lp_clean = subject.log_probs(tokens)
    for r in graph.receivers:
        site = clean[r.site]
        p = graph.groups[r.site][next(iter(graph.groups[r.site]))][-1]
        if r.capture is None:  # the output: the position that predicts the last target token
            p = H - 1 if family in ("theorem1", "default") else int(subject.layout.prediction_positions()[H - 1])
        delta = torch.zeros_like(site)
        delta[:, p] = torch.randn(site.shape[-1], generator=g, dtype=site.dtype)
        if r.capture is None and family in ("theorem1", "default"):  # the site is a mixture: keep it positive
            delta = 0.1 * delta.abs()
        lp, moved = _grab_all(subject, tokens, captures, [Intervention(r.site, "add", value=delta).fwd_hook()])
        if r.capture is None:  # only that prediction moves
            change = (lp - lp_clean).abs()
            assert change[:, H - 1].max() > 1e-6 and change[:, : H - 1].max() <= 1e-9
            continue
        change = (moved[r.capture] - clean[r.capture]).abs()
        assert change.max() > 1e-6, f"{r.node}.{r.input}: editing {r.site} does not reach {r.capture}"
        assert r.positionwise == (r.capture != "blocks.0.attn.hook_z")  # the copyers read every position
        if r.positionwise:
            others = torch.ones(change.shape[1], dtype=torch.bool)
            others[p] = False
            assert change[:, others].max() <= 1e-6, f"{r.capture} moved at positions other than {p}"


def test_bridge_resid_mid_reaches_only_ln2_and_attn_out_reaches_the_residual(subjects):
    """On a TransformerBridge an edit of blocks.0.hook_resid_mid changes the MLP's output but does not
    itself enter the residual stream; an edit of blocks.0.hook_attn_out does (the site standard_circuit's
    through-the-MLP path patch now uses); a head's write is hook_z through W_O, as Sender.write reads it."""
    subject = subjects["bridge"]
    tokens, _ = subject.task.sample(3, torch.Generator().manual_seed(0))
    names = ["blocks.0.hook_mlp_out", "blocks.0.hook_resid_post", "blocks.0.hook_resid_mid", "blocks.0.attn.hook_z"]
    _, clean = _grab_all(subject, tokens, names)
    delta = torch.zeros_like(clean["blocks.0.hook_resid_mid"])
    delta[:, 2] = torch.randn(delta.shape[-1], generator=torch.Generator().manual_seed(2))
    for site, carried in (("blocks.0.hook_resid_mid", 0.0), ("blocks.0.hook_attn_out", 1.0)):
        _, moved = _grab_all(subject, tokens, names, [Intervention(site, "add", value=delta).fwd_hook()])
        mlp = moved["blocks.0.hook_mlp_out"] - clean["blocks.0.hook_mlp_out"]
        resid = moved["blocks.0.hook_resid_post"] - clean["blocks.0.hook_resid_post"]
        assert mlp.abs().max() > 1e-4
        assert torch.allclose(resid, mlp + carried * delta, atol=1e-5)
    z = clean["blocks.0.attn.hook_z"].clone()
    z[:, :, 1] += 0.5
    _, moved = _grab_all(subject, tokens, names, [Intervention("blocks.0.attn.hook_z", "patch", value=z).fwd_hook()])
    W_O = subject.model.blocks[0].attn.W_O[1].detach()
    want = clean["blocks.0.hook_resid_mid"] + 0.5 * W_O.sum(0)
    assert torch.allclose(moved["blocks.0.hook_resid_mid"], want, atol=1e-5)


def _paper_truth(subject, graph) -> set:
    """The true edges of the paper's circuit on the disentangled model, read from the Theorem 1
    construction of the subject's task: a copyer reads its demonstration; a layer-1 input reads subspace s
    where the construction's W_KQ (query columns / key rows) or W_OV has a non-zero block; the head writes
    the output."""
    task = subject.task
    exact = models.theorem1_model(task.pi, task.n_examples, task.seq_len, 50.0, task.root)
    d, K = task.d_vocab, exact.cfg.n_copy_heads
    W_KQ, W_OV = exact.blocks[1].attn.W_KQ.detach(), exact.blocks[1].attn.W_OV.detach()
    block = lambda s: slice(s * d, (s + 1) * d)  # noqa: E731
    sub = {"embed": 0, **{f"L0H{k}": k + 1 for k in range(K)}}

    def true(e) -> bool:
        if e.receiver == "output":
            return True
        if e.receiver.kind == "head" and e.receiver.layer == 0:
            return e.group == "demonstrations"
        s = sub[e.sender]
        w = {"q": W_KQ[d:, block(s)], "k": W_KQ[block(s), d:], "v": W_OV[block(s)]}[e.input]
        return bool(w.abs().max() > 1e-9) and not (e.input == "q" and s == 0)

    return {e for e in graph.edges if true(e)}


def _abs(scores) -> dict:
    """|mean score| per edge, of an EdgeScores."""
    return {e: abs(x) for e, x in scores.means().items()}


@pytest.mark.parametrize("spec", ["theorem1:beta=50", "default"])
def test_exact_patching_and_eap_ig_recover_the_paper_circuit(spec):
    subject = load_subject(spec)
    subject.model.eval()
    graph = build_graph(subject)
    task = subject.task
    tokens, _ = task.sample(48, torch.Generator().manual_seed(0))
    resampled, _ = task.sample(48, torch.Generator().manual_seed(1))
    runner = Runner(subject, graph, tokens, sender_writes(subject, graph, resampled)[0])
    truth = _paper_truth(subject, graph)
    assert 0 < len(truth) < len(graph.edges)
    # Ranked by |score|: ablating a true edge may help on a finite sample (the resampled contexts differ).
    assert roc_auc(_abs(exact_scores(runner)), truth) == 1.0
    assert roc_auc(_abs(eap_ig_scores(runner)), truth) >= 0.95
    # The known circuit alone keeps the model's progress over the uniform-parent plateau.
    kept = [e for e in graph.edges if e in truth]
    plateau = bma_predictive(task.pi, tokens, task.n_examples, task.seq_len, task.root, demonstrations=[], log=True)
    plateau_nll = per_context_nll(plateau, tokens)
    share, se = ratio_se(plateau_nll - runner.keep_only_values(kept), plateau_nll - runner.clean_values)
    print(f"known circuit keeps {share:.4f} +- {se:.4f} of the progress")
    assert share >= 0.95


def _linear_subject():
    """A one-layer attention-only transformer with no normalisation: its logits are linear in every
    head's value input and in the final residual."""
    task = build_task(n_examples=2, seq_len=3)
    layout = Layout(task.n_examples, task.seq_len, task.d_vocab)
    cfg = HookedTransformerConfig(n_layers=2, d_model=6, n_ctx=layout.n_positions, d_head=3, n_heads=2,
                                  d_vocab=task.d_vocab, attn_only=True, normalization_type=None, dtype="float64")  # fmt: skip
    model = HookedTransformer(cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    return StandardSubject(model.eval(), task, layout, "linear", "0"), task


def _logit_difference(log_probs, tokens):
    return (log_probs[..., 0] - log_probs[..., 1]).mean(-1)  # each context's logits' difference: linear in them


def test_eap_equals_exact_patching_where_the_metric_is_linear_in_the_input_and_scores_add_up():
    subject, task = _linear_subject()
    graph = build_graph(subject)
    tokens, _ = task.sample(16, torch.Generator().manual_seed(0))
    resampled, _ = task.sample(16, torch.Generator().manual_seed(1))
    runner = Runner(subject, graph, tokens, sender_writes(subject, graph, resampled)[0], _logit_difference)
    linear = [e for e in graph.edges if e.receiver == "output" or (e.receiver.layer == 1 and e.input == "v")]
    exact, eap = exact_scores(runner, linear).means(), eap_scores(runner, linear).means()
    assert max(abs(a) for a in exact.values()) > 1e-3
    assert torch.allclose(torch.tensor([exact[e] for e in linear]), torch.tensor([eap[e] for e in linear]), atol=1e-9,
                          rtol=1e-7)  # fmt: skip
    into_output = [e for e in graph.edges if e.receiver == "output"]
    total = runner.run(into_output) - runner.clean_metric
    assert abs(sum(exact_scores(runner, into_output).means().values()) - total) < 1e-9
    # Where the metric is not linear (layer-0 queries feed a softmax), EAP is only an approximation.
    q0 = [e for e in graph.edges if e.receiver.layer == 0 and e.input == "q"]
    exact, eap = exact_scores(runner, q0).means(), eap_scores(runner, q0).means()
    assert max(abs(exact[e] - eap[e]) for e in q0) > 1e-6


def test_a_model_without_the_hooks_is_refused_in_one_line():
    subject = transposed_subject(build_task(n_examples=2, seq_len=3))
    del subject.model.hook_dict["blocks.1.attn.hook_k"]  # a model whose attention has no key hook
    with pytest.raises(ValueError, match="circuit discovery needs the hooks blocks.1.attn.hook_k,"):
        build_graph(subject)


def _one_edge_by_hand(subject, graph, tokens, source, clean, edge):
    """Per context, the NLL change when ``edge`` alone is ablated, with hand-written hooks: one pass adds the
    sender's change (ablated minus clean write) at the receiver's site at the edge's positions and keeps the
    receiver's activation; a second patches it in (the receiver's head, every position). For the output,
    one pass with the change added at its site."""
    r = graph.receiver(edge.receiver, edge.input)
    key, positions = (edge.sender, r.site), graph.groups[r.site][edge.group]
    delta = torch.zeros_like(clean[key])
    delta[:, positions] = (source[key] - clean[key]).expand_as(delta)[:, positions]
    hooks = [(r.site, lambda x, hook: x + delta)]
    if r.capture is not None:
        kept = {}
        subject.log_probs(tokens, hooks + [(r.capture, lambda x, hook: kept.update(a=x.clone()))])

        def patch(x, hook):
            x = x.clone()
            x[:, :, r.head] = kept["a"][:, :, r.head]
            return x

        hooks = [(r.capture, (lambda x, hook: kept["a"]) if r.head is None else patch)]
    return per_context_nll(subject.log_probs(tokens, hooks), tokens) - per_context_nll(subject.log_probs(tokens), tokens)


@pytest.mark.parametrize("family", ["bridge", "default", "nanogpt"])
def test_batched_exact_patching_equals_edge_by_edge_runs_per_context(subjects, family):
    """exact_scores shares one edited pass among every edge of a sender at a site (and every receiver
    reading it) and runs several edges' copies of the contexts per pass; per context it equals each edge
    ablated alone by hand-written hooks, and run_values([edge]) (the circuit runner's own path)."""
    subject = subjects[family]
    graph = build_graph(subject)
    tokens, _ = subject.task.sample(6, torch.Generator().manual_seed(0))
    resampled, _ = subject.task.sample(6, torch.Generator().manual_seed(1))
    source = sender_writes(subject, graph, resampled)[0]
    runner = Runner(subject, graph, tokens, source, rows=5 * len(tokens))
    senders = {"embed", "L0H1", "MLP0"} if family != "default" else {"embed", "L0H1", "L0H7", "L1H0"}
    edges = [e for e in graph.edges if e.sender in senders]
    batched = exact_scores(runner, edges).values
    assert runner.copies == 5 and batched.shape == (len(edges), 6)
    by_hand = torch.stack([_one_edge_by_hand(subject, graph, tokens, source, runner.clean, e) for e in edges])
    assert batched.abs().max() > 1e-3 and (batched.abs().amax(1) > 1e-6).sum() > len(edges) // 3
    assert torch.allclose(batched, by_hand, atol=1e-6)
    one_by_one = torch.stack([runner.run_values([e]) - runner.clean_values for e in edges[::5]])
    assert torch.allclose(batched[::5], one_by_one, atol=1e-6)


def test_a_sender_whose_ablated_value_is_its_clean_write_scores_exactly_zero(subjects):
    """The position embedding is the same on every context, so its mean is itself: under mean ablation its
    edges change nothing and score exactly 0 on every context (no pass is run for them), and none is ranked
    among the edges beyond --min-z standard errors. Before, the mean summed in float32 was off by float
    rounding, those edges scored about 1e-8 with standard errors of about 4e-9, and eight of them were ranked
    first and kept in the shipped GPT-2's circuit (figures/circuit.json of 2026-12-03). The other edges'
    scores still equal each edge ablated alone by the runner's circuit run."""
    from models.interp.circuit.search import ranked

    subject = subjects["bridge"]
    graph = build_graph(subject)
    tokens = subject.task.sample(32, torch.Generator().manual_seed(0))[0]
    runner = Runner(subject, graph, tokens, source_writes(subject, graph, tokens, "mean", 0))
    moved = [k for k in runner.source if k[0] == "pos_embed"]
    assert moved and all(torch.equal(runner.source[k][0], runner.clean[k][0]) for k in moved)
    scores = exact_scores(runner)
    position = [e for e in graph.edges if e.sender == "pos_embed"]
    assert all(torch.equal(scores[e], torch.zeros(len(tokens), dtype=torch.float64)) for e in position)
    stats = scores.with_se()
    beyond = ranked(stats, 2.0)[: sum(abs(m) > 2 * se for m, se in stats.values())]
    assert beyond and not any(e.sender == "pos_embed" for e in beyond)
    others = [e for e in graph.edges if e.sender != "pos_embed"][::9]
    alone = torch.stack([runner.run_values([e]) - runner.clean_values for e in others])
    assert torch.allclose(torch.stack([scores[e] for e in others]), alone, atol=1e-6)


@pytest.mark.parametrize("positions", [None, (0, 1, 2)])
def test_node_costs_several_nodes_to_a_pass_equal_one_node_a_pass(subjects, positions):
    """node_costs runs several nodes' mean ablations in one pass, each on its own copy of the contexts; per
    node and context it equals that node alone mean-ablated in a pass of its own (node_ablated_values, every
    other node kept) minus the clean run, at every position or at some."""
    from models.interp.circuit import node_ablated_values, node_costs

    subject = subjects["bridge"]
    graph = build_graph(subject)
    tokens, reference = (subject.task.sample(n, torch.Generator().manual_seed(n))[0] for n in (12, 40))
    costs = node_costs(subject, graph, tokens, reference, rows=5 * len(tokens), positions=positions)
    clean = per_context_nll(subject.log_probs(tokens), tokens)
    assert len(costs) > 5 and max(v.abs().max() for v in costs.values()) > 1e-3
    for n, v in costs.items():
        alone = node_ablated_values(subject, graph, tokens, [m for m in costs if m != n], "mean", reference,
                                    positions=positions) - clean  # fmt: skip
        assert torch.allclose(v, alone, atol=1e-9), n


def test_cli_writes_the_set_and_refuses_an_unknown_node_in_one_line(tmp_path, capsys):
    import json

    from analyses import circuit, common

    argv = ["--checkpoint", "theorem1:beta=50", "--out", str(tmp_path), "--n-contexts", "8", "--curve-points", "2",
            "--n-held-out", "16"]  # fmt: skip
    r = circuit.main(argv + ["--nodes", ",".join([f"L0H{k}" for k in range(10)] + ["L1H0"])]).data
    assert r["faithfulness"] == pytest.approx(1.0, abs=1e-9)  # every edge between every node: the full model
    saved = json.loads((tmp_path / "circuit.json").read_text())["results"]
    assert {"nodes", "edges", "n_edges_total", "ablation", "corruption", "metric", "checkpoint_hash", "curve"} <= set(
        saved
    )
    assert (
        saved["interventions"]
        and (tmp_path / "circuit_graph.pdf").exists()
        and (tmp_path / "circuit_curve.png").exists()
    )
    assert "denoising_faithfulness" not in saved and all(e["se"] >= 0 for e in saved["all_edges"])
    for row in saved["by_input"]:  # each input's summed score: the sum of its edges' scores
        into = [e for e in saved["all_edges"] if (e["input"], e["group"]) == (row["input"], row["group"])
                and (e["receiver"] == row["receivers"] or e["receiver"].startswith(row["receivers"] + "H"))]
        assert row["n_edges"] == len(into) and row["sum"] == pytest.approx(sum(e["score"] for e in into), abs=1e-12)
    assert sum(row["n_edges"] for row in saved["by_input"]) == saved["n_edges_total"]
    assert max(row["se"] for row in saved["by_input"]) > 0
    nodes = ",".join([f"L0H{k}" for k in range(10)] + ["L1H0"])
    denoised = [a if a != str(tmp_path) else str(tmp_path / "denoised") for a in argv]
    r = circuit.main(denoised + ["--direction", "denoising", "--method", "eap", "--nodes", nodes, "--corruption",
                                 "demonstrations"]).data  # fmt: skip
    assert r["faithfulness"] == pytest.approx(1.0, abs=1e-9) and r["denoising_faithfulness"] == pytest.approx(1.0, abs=1e-5)
    assert [c["n_edges"] for c in r["denoising_curve"]] == [c["n_edges"] for c in r["curve"]]
    assert r["denoising_curve"][0]["faithfulness"] == pytest.approx(0.0, abs=1e-12)
    assert r["denoising_curve"][-1]["faithfulness"] == pytest.approx(1.0, abs=1e-5)
    assert all(e["se"] > 0 for e in r["edges"] if e["score"] != 0)  # EAP scores carry their standard error
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        common.run_cli(circuit.main, argv + ["--nodes", "L7H3"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no node L7H3" in err[0]
    with pytest.raises(SystemExit) as e:
        common.run_cli(circuit.main, argv + ["--direction", "denoising", "--corruption", "mean"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--direction denoising needs a corruption that is a run on other contexts" in err[0]


def test_inspect_sufficiency_is_the_share_kept_with_every_other_head_mean_ablated():
    """Against a hand-written hook: the copyers' hook_z replaced by its mean over the contexts."""
    from models.interp.inspection import sufficiency
    from probes import bma_predictive
    from probes import target_nll as nll

    # alpha 0.1: a sharp pi, so that the model's gain over the plateau on 40 contexts is beyond 2 SE (with the
    # default, 0.006 +- 0.009 nats, a share of nothing, which inspect now refuses)
    task = build_task(n_examples=3, seq_len=4, alpha=0.1)
    subject = subject_of(models.theorem1_model(task.pi, 3, 4, 5.0), task, None, "theorem1", "0")
    tokens, _ = task.sample(40, torch.Generator().manual_seed(3))
    log: list = []
    got = sufficiency(subject, tokens, ["L0H0", "L1H0"], log)

    def mean_rest(z, hook):
        z = z.clone()
        z[:, :, 1:] = z[:, :, 1:].mean(0, keepdim=True)
        return z

    plateau = bma_predictive(task.pi, tokens, 3, 4, task.root, demonstrations=[], log=True)
    ablated = subject.log_probs(tokens, [("blocks.0.attn.hook_z", mean_rest)])
    one = lambda lp, i: nll(lp[i : i + 1], tokens[i : i + 1])  # noqa: E731
    a = torch.tensor([one(plateau, i) - one(ablated, i) for i in range(40)], dtype=torch.float64)
    b = torch.tensor([one(plateau, i) - one(subject.log_probs(tokens), i) for i in range(40)], dtype=torch.float64)
    assert got["share"] == pytest.approx((a.mean() / b.mean()).item(), abs=1e-9)
    assert 0 < got["se"] < 1 and got["share"] < 0.99  # ablating two of three copyers costs progress
    assert log and log[0]["hook"] == "blocks.0.attn.hook_z" and log[0]["heads"] == [1, 2]


def test_greedy_pruning_keeps_exactly_the_paper_circuit_on_theorem1():
    from models.interp.circuit import greedy

    subject = load_subject("theorem1:beta=50")
    graph = build_graph(subject)
    tokens, _ = subject.task.sample(24, torch.Generator().manual_seed(0))
    resampled, _ = subject.task.sample(24, torch.Generator().manual_seed(1))
    runner = Runner(subject, graph, tokens, sender_writes(subject, graph, resampled)[0])
    kept = set(greedy(runner, 1e-9))
    assert kept == _paper_truth(subject, graph)


def _progress_kept(runner, task, tokens, kept) -> float:
    plateau = bma_predictive(task.pi, tokens, task.n_examples, task.seq_len, task.root, demonstrations=[], log=True)
    plateau_nll = per_context_nll(plateau, tokens)
    share, se = ratio_se(plateau_nll - runner.keep_only_values(kept), plateau_nll - runner.clean_values)
    print(f"known circuit keeps {share:.4f} +- {se:.4f} of the progress")
    return share


@pytest.mark.parametrize("corruption", ["demonstrations", "target"])
def test_exact_patching_and_eap_ig_recover_the_transposed_circuit(corruption):
    """The constructed transposed circuit (tests/helpers/constructed.py): the edges each corruption can see, read
    from the construction, are the ones exact patching and EAP-IG rank first, and they alone keep the
    model's progress."""
    task = build_task(n_examples=3, seq_len=4, alpha=0.3)
    subject = transposed_subject(task)
    graph = build_graph(subject)
    tokens, _ = task.sample(48, torch.Generator().manual_seed(0))
    runner = Runner(subject, graph, tokens, source_writes(subject, graph, tokens, corruption, 0))
    truth = transposed_truth(graph, corruption)
    assert 0 < len(truth) < len(graph.edges)
    exact = exact_scores(runner)
    assert roc_auc(_abs(exact), truth) == 1.0
    assert roc_auc(_abs(eap_ig_scores(runner)), truth) >= 0.95
    assert max(x for e, x in _abs(exact).items() if e not in truth) < 1e-12  # the rest do exactly nothing
    assert _progress_kept(runner, task, tokens, [e for e in graph.edges if e in truth]) >= 0.95


def test_a_head_that_matters_only_on_the_target_side_is_found_by_the_target_corruption():
    """L0H1 of the transposed circuit hands the read-out the target's own prefix. Corrupting the
    demonstrations cannot see it (every edge into or out of it scores exactly 0); re-drawing the target's
    tokens finds it among the strongest edges."""
    task = build_task(n_examples=3, seq_len=4, alpha=0.3)
    subject = transposed_subject(task)
    graph = build_graph(subject)
    tokens, _ = task.sample(32, torch.Generator().manual_seed(1))
    l0h1 = [e for e in graph.edges if "L0H1" in (e.sender, e.receiver)]
    scores = {}
    for corruption in ("demonstrations", "target"):
        runner = Runner(subject, graph, tokens, source_writes(subject, graph, tokens, corruption, 0))
        scores[corruption] = exact_scores(runner).means()
    assert max(abs(scores["demonstrations"][e]) for e in l0h1) == 0
    strongest = sorted(graph.edges, key=lambda e: -abs(scores["target"][e]))[:3]
    assert {(e.sender, e.receiver) for e in strongest if "L0H1" in (e.sender, e.receiver)} == {
        ("embed", "L0H1"), ("L0H1", "output")}  # fmt: skip
    assert all(scores["target"][e] > 0.05 for e in strongest)


def _final_resid_patch(subject, tokens, sub: slice, positions, value):
    """NLL of the targets with the final residual's subspace ``sub`` at ``positions`` set to ``value``
    (``[batch or 1, len(positions), width]``): a hand-written hook, no models.interp.circuit."""

    def hook(x, hook):
        x = x.clone()
        x[:, positions, sub] = value
        return x

    lp = subject.log_probs(tokens, [("blocks.1.hook_resid_post", hook)])
    return per_context_nll(lp, tokens).mean().item()


def _final_resid(subject, tokens):
    store = {}
    subject.log_probs(tokens, [("blocks.1.hook_resid_post", lambda x, hook: store.update(r=x.clone()))])
    return store["r"]


def test_target_corruption_and_mean_ablation_do_what_they_say():
    """Against hand-written hooks on the transposed circuit, whose heads write into their own subspaces.
    target: the demonstrations kept, the target's tokens re-drawn uniformly; the edge L0H1 -> output at
    the target scores what setting the final residual's L0H1 subspace there to its value on those contexts
    costs. mean: the edge L1H0 -> output scores what setting L1H0's subspace to its mean over fresh
    contexts (held out, none of them a clean one) costs, which differs from the mean over the batch."""
    task = build_task(n_examples=3, seq_len=4, alpha=0.3)
    subject = transposed_subject(task)
    model, graph, H = subject.model, build_graph(subject), task.seq_len
    tokens, _ = task.sample(64, torch.Generator().manual_seed(2))
    target = list(range(task.n_examples * H, (task.n_examples + 1) * H))
    clean_nll = per_context_nll(subject.log_probs(tokens), tokens).mean().item()

    other = other_contexts(task, tokens, "target", 0)
    assert torch.equal(other[:, :-H], tokens[:, :-H])
    assert (other[:, -H:] != tokens[:, -H:]).any(1).float().mean() > 0.9
    counts = torch.bincount(other[:, -H:].flatten(), minlength=task.d_vocab).double()
    assert counts.min() > 0  # every token drawn, as a uniform draw of 256 tokens over d_vocab does
    runner = Runner(subject, graph, tokens, source_writes(subject, graph, tokens, "target", 0))
    B = model.sub["B"]
    want = _final_resid_patch(subject, tokens, B, target, _final_resid(subject, other)[:, target, B]) - clean_nll
    edge = graph.find("L0H1->output.out@target")
    got = exact_scores(runner, [edge]).means()[edge]
    assert want > 0.05 and got == pytest.approx(want, abs=1e-9)

    held_out = task.sample(64, torch.Generator().manual_seed(0 + 7919))[0]  # the seed's held-out contexts
    assert not (held_out.unsqueeze(1) == tokens.unsqueeze(0)).all(-1).any()
    Z = model.sub["Z"]
    mean = _final_resid(subject, held_out)[:, target, Z].mean(0, keepdim=True)
    want = _final_resid_patch(subject, tokens, Z, target, mean) - clean_nll
    runner = Runner(subject, graph, tokens, source_writes(subject, graph, tokens, "mean", 0))
    edge = graph.find("L1H0->output.out@target")
    got = exact_scores(runner, [edge]).means()[edge]
    assert want > 0.05 and got == pytest.approx(want, abs=1e-9)
    batch_mean = _final_resid(subject, tokens)[:, target, Z].mean(0, keepdim=True)
    assert abs(_final_resid_patch(subject, tokens, Z, target, batch_mean) - clean_nll - got) > 1e-4


def test_denoising_is_minus_noising_where_the_metric_is_linear_and_restores_the_clean_run_in_sum():
    """Where the metric is linear in the final residual (the linear model, a logit difference), an edge
    into the output scores g . (corrupted - clean write) noising and g . (clean - corrupted) denoising: the
    same number with the other sign; restoring every edge into the output restores the clean metric, so
    the denoising scores sum to clean - corrupted."""
    subject, task = _linear_subject()
    graph = build_graph(subject)
    tokens, _ = task.sample(16, torch.Generator().manual_seed(0))
    into_output = [e for e in graph.edges if e.receiver == "output"]
    noising = Runner(subject, graph, tokens, source_writes(subject, graph, tokens, "resample", 3), _logit_difference)
    denoising = denoising_runner(subject, graph, tokens, "resample", 3, _logit_difference)
    noise, denoise = exact_scores(noising, into_output).means(), exact_scores(denoising, into_output).means()
    assert max(abs(x) for x in noise.values()) > 1e-3
    assert torch.allclose(torch.tensor([denoise[e] for e in into_output]), -torch.tensor([noise[e] for e in into_output]),
                          atol=1e-9)  # fmt: skip
    other = other_contexts(task, tokens, "resample", 3)
    corrupted = _logit_difference(subject.log_probs(other), tokens).mean().item()
    clean = _logit_difference(subject.log_probs(tokens), tokens).mean().item()
    assert sum(denoise.values()) == pytest.approx(clean - corrupted, abs=1e-9)
    assert denoising.clean_metric == pytest.approx(corrupted, abs=1e-12)
    with pytest.raises(ValueError, match="denoising needs a corruption that is a run on other contexts"):
        denoising_runner(subject, graph, tokens, "mean", 3)


@pytest.mark.parametrize("method", ["eap", "eap-ig"])
def test_eap_and_eap_ig_per_context_values_equal_brute_force_derivatives(method):
    """EAP and EAP-IG per context against derivatives computed by brute force: at the clean run (EAP) or at
    each midpoint alpha of the embeddings' path from clean to corrupted (EAP-IG), the derivative of each
    context's metric along the edge's change is a central finite difference of forward passes that add
    eps * (sender's change @ W_Q / W_K) to the receiving head's hook_q / hook_k at the edge's positions
    (the model has no normalisation, so a head's query is affine in its residual); its mean over the
    midpoints is that context's value, and the score is the mean over the contexts."""
    subject, task = _linear_subject()
    model = subject.model
    graph = build_graph(subject)
    tokens, _ = task.sample(8, torch.Generator().manual_seed(0))
    other, _ = task.sample(8, torch.Generator().manual_seed(1))
    runner = Runner(subject, graph, tokens, sender_writes(subject, graph, other)[0], _logit_difference)
    edges = [e for e in graph.edges if e.input in ("q", "k")]
    steps = 4
    if method == "eap":
        got, alphas = eap_scores(runner, edges).values, [0.0]
    else:
        got, alphas = eap_ig_scores(runner, edges, steps=steps).values, [(i + 0.5) / steps for i in range(steps)]

    def cache(toks):
        store = {}
        names = ["hook_embed", "blocks.0.attn.hook_z"]
        subject.log_probs(toks, [(n, lambda x, hook, n=n: store.update({n: x.clone()})) for n in names])
        return store

    clean, corrupt = cache(tokens), cache(other)

    def write(c, sender):
        if sender == "embed":
            return c["hook_embed"]
        assert sender.layer == 0
        return c["blocks.0.attn.hook_z"][:, :, sender.head] @ model.blocks[0].attn.W_O[sender.head].detach()

    positions = {g: graph.groups["blocks.0.hook_resid_pre"][g] for g in graph.groups["blocks.0.hook_resid_pre"]}
    eps = 1e-6
    want = []
    for e in edges:
        if e.sender == "pos_embed":
            want.append(torch.zeros(len(tokens), dtype=torch.float64))
            continue
        layer, head = e.receiver.layer, e.receiver.head
        change = torch.zeros_like(clean["hook_embed"])
        change[:, positions[e.group]] = (write(corrupt, e.sender) - write(clean, e.sender))[:, positions[e.group]]
        W = getattr(model.blocks[layer].attn, "W_Q" if e.input == "q" else "W_K")[head].detach()
        total = 0.0
        for alpha in alphas:
            move = alpha * (corrupt["hook_embed"] - clean["hook_embed"])

            def metric(sign):
                def nudge(x, hook):
                    x = x.clone()
                    x[:, :, head] += sign * eps * (change @ W)
                    return x

                hooks = [("hook_embed", lambda x, hook: x + move), (f"blocks.{layer}.attn.hook_{e.input}", nudge)]
                return _logit_difference(subject.log_probs(tokens, hooks), tokens).detach()

            total = total + (metric(1) - metric(-1)) / (2 * eps)
        want.append(total / len(alphas))
    want = torch.stack(want)
    assert got.shape == want.shape == (len(edges), len(tokens))
    assert want.abs().max() > 1e-3 and (want.std(1) > 1e-4).any()  # the contexts differ
    assert torch.allclose(got, want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("spec", ["theorem1:beta=50", "default", "transposed"])
def test_denoising_faithfulness_restores_with_the_known_circuit_nothing_without_and_all_with_every_edge(spec):
    """The corrupted run (another tree's demonstrations) with only the known circuit's edges restored to
    their clean values recovers at least 0.95 of the clean-minus-corrupted NLL; with no edge restored it
    is the corrupted run (0), with every edge restored the clean run (1)."""
    from models.interp.circuit.scores import restored

    if spec == "transposed":
        subject = transposed_subject(build_task(n_examples=3, seq_len=4, alpha=0.3))
        graph = build_graph(subject)
        truth = transposed_truth(graph, "demonstrations")
    else:
        subject = load_subject(spec)
        graph = build_graph(subject)
        truth = _paper_truth(subject, graph)
    tokens, _ = subject.task.sample(48, torch.Generator().manual_seed(0))
    denoiser = denoising_runner(subject, graph, tokens, "demonstrations", 0)
    clean = per_context_nll(subject.log_probs(tokens), tokens)
    assert (denoiser.clean_values - clean).mean() > 0.05  # the corruption costs something to recover
    known = [e for e in graph.edges if e in truth]
    nothing, everything, circuit = (restored(denoiser, kept, clean) for kept in ([], graph.edges, known))
    print(f"{spec}: the known circuit recovers {circuit.faithfulness:.4f} +- {circuit.se:.4f}")
    assert abs(nothing.faithfulness) < 1e-12 and abs(everything.faithfulness - 1) < 1e-5
    assert circuit.faithfulness >= 0.95 and circuit.n_edges < len(graph.edges)


def test_a_record_intervention_changes_nothing_and_keeps_the_tensor_gradients_flow_through():
    """``Intervention(hook, "record", store=...)``: the run is bit for bit the plain one, the store holds the
    activation itself, and the metric's gradient there equals its gradient at a zero change added to it (a
    leaf tensor); a selection or a missing store is refused."""
    task = build_task(n_examples=3, seq_len=4)
    subject = subject_of(models.theorem1_model(task.pi, 3, 4, 5.0), task, None, "theorem1", "0")
    tokens, _ = task.sample(5, torch.Generator().manual_seed(0))
    name = "blocks.1.attn.hook_attn_scores"
    kept: dict = {}
    lp = subject.log_probs(tokens, [Intervention(name, "record", store=kept).fwd_hook()])
    assert torch.equal(lp, subject.log_probs(tokens)) and kept[name].shape[0] == 5
    (g_record,) = torch.autograd.grad(per_context_nll(lp, tokens).sum(), kept[name])
    zero = torch.zeros_like(kept[name]).requires_grad_(True)
    lp = subject.log_probs(tokens, [(name, lambda x, hook: x + zero)])
    (g_leaf,) = torch.autograd.grad(per_context_nll(lp, tokens).sum(), zero)
    assert g_leaf.abs().max() > 1e-6 and torch.equal(g_record, g_leaf)
    with pytest.raises(ValueError, match="keeps the whole activation"):
        Intervention(name, "record", heads=(0,), store={})
    with pytest.raises(ValueError, match="a 'record' needs one"):
        Intervention(name, "record")


@pytest.mark.parametrize("corruption", [None, "demonstrations"])
def test_the_default_finds_the_target_side_head_and_reports_node_level_sufficiency(corruption):
    """On the transposed circuit, L0H1 reads only the target's own prefix: the demonstrations corruption
    cannot see it. The default (demonstrations and mean ablation) finds it, says it is on the target side and
    needed by mean ablation only, and the nodes it reports are those of the construction (tests/constructed.py),
    which alone, every other node mean- or resample-ablated, keep the progress on held-out contexts. With the
    demonstrations corruption alone, L0H1 is still added: its mean ablation alone costs > 3 standard errors."""
    from constructed import USED

    from analyses import circuit

    task = build_task(n_examples=3, seq_len=4, alpha=0.3)
    subject = transposed_subject(task)
    config = CircuitConfig(n_contexts=48, n_held_out=256, **({} if corruption is None else {"corruptions": (corruption,)}))
    found = discover(subject, config)
    r = found.to_dict()
    assert [str(n) for n in found.nodes] == r["nodes"] and found.sufficiency == (r["sufficiency"], r["sufficiency_se"])
    truth = {n for used in USED.values() for edge in used for n in edge[:2]} - {"embed", "output"}
    assert set(r["nodes"]) == truth == {"L0H0", "L0H1", "MLP0", "L1H0"}
    role = r["node_roles"]["L0H1"]
    if corruption is None:
        assert r["corruptions"] == ["demonstrations", "mean"]
        assert role["needed_by"] == ["mean"] and role["side"] == "target side" and "(> 3 SE)" in role["added"]
        assert "L0H1" not in {n for e in r["searches"]["demonstrations"]["edges"] for n in (e["sender"], e["receiver"])}
    else:
        assert role["needed_by"] == [] and "(> 3 SE)" in role["added"]
    h = r["held_out"]
    assert h["n_contexts"] == 256 and r["replicate"]["n_contexts"] == 256
    for a in ("mean", "resample"):  # the construction computes BMA from these nodes alone
        assert h[f"sufficiency_{a}"] == pytest.approx(1.0, abs=1e-6) and h[f"sufficiency_{a}_se"] < 1e-3
    text = circuit.summary(r)
    assert "carries the demonstrations' evidence" in text and "computes the prediction: its nodes alone keep 1.000" in text
    assert "L0H1: target side" in text  # its mean ablation costs at the target positions only
    assert role["ablated_at"]["target"]["cost"] > 3 * role["ablated_at"]["target"]["se"]
    assert abs(role["ablated_at"]["demonstrations"]["cost"]) < 1e-9


def test_the_held_out_sample_is_sized_from_a_pilots_spread_and_reaches_its_standard_error():
    """``held_out_size``: a pilot's progress standard error scaled to --target-se (its spread over the pilot,
    as NumPy computes it: n = ceil(n_pilot * (se / target_se)^2), the delta method on paired contexts), within
    [MIN_HELD_OUT, MAX_HELD_OUT] and what fits; on a fresh sample of that size the progress's standard error is
    then the target's, to the pilot's precision; those contexts are none of the pilot's. Before, the sample
    doubled from 512, one full pass per size tried."""
    from models.interp.baselines import per_context_baselines
    from models.interp.circuit import discovery as module

    subject = load_subject("default")
    search = subject.task.sample(256, torch.Generator().manual_seed(0))[0]
    plateau, bma = per_context_baselines(subject.task, search)
    with torch.no_grad():
        full = per_context_nll(subject.log_probs(search), search)
    a, b = (plateau - full).numpy(), (plateau - bma).numpy()
    ratio = a.mean() / b.mean()
    se = np.std(a - ratio * b, ddof=1) / np.sqrt(len(a)) / abs(b.mean())
    target = se * np.sqrt(256 / 3000.5)  # a size between the bounds, away from an integer
    config = CircuitConfig(n_contexts=256, target_se=float(target))
    n = module.held_out_size(config, plateau, full, bma)
    assert n == int(np.ceil(256 * (se / target) ** 2)) and 2900 < n < 3100
    held = module.sample(subject.task, n, config.seed + module.SEEDS["held_out"])
    plateau_h, bma_h = per_context_baselines(subject.task, held)
    with torch.no_grad():
        reached = ratio_se(plateau_h - per_context_nll(subject.log_probs(held), held), plateau_h - bma_h)[1]
    assert 0.75 * target < reached < 4 / 3 * target
    assert not (held.unsqueeze(1) == search.unsqueeze(0)).all(-1).any()
    assert module.held_out_size(CircuitConfig(target_se=1e-9), plateau, full, bma) == module.MAX_HELD_OUT
    assert module.held_out_size(CircuitConfig(target_se=1e-9), plateau, full, bma, most=1000) == 1000
    assert module.held_out_size(CircuitConfig(target_se=10.0), plateau, full, bma) == module.MIN_HELD_OUT
    assert module.held_out_size(CircuitConfig(n_held_out=77), plateau, full, bma) == 77


def test_discover_sizes_the_held_out_sample_from_its_first_512_contexts():
    """The pilot ``discover`` sizes its held-out sample from is that sample's own first MIN_HELD_OUT contexts
    (their clean run is the answers' own, so the pilot costs nothing): the size is ``held_out_size`` of their
    progress, computed here from the model's log-probabilities, and the sample is those contexts followed by
    fresh ones; the clean run's metric returned is the model's on every one of them."""
    from models.interp.baselines import per_context_baselines
    from models.interp.circuit import discovery as module

    subject = load_subject("default")
    first = module.sample(subject.task, module.MIN_HELD_OUT, module.SEEDS["held_out"])
    plateau, bma = per_context_baselines(subject.task, first)
    with torch.no_grad():
        full = per_context_nll(subject.log_probs(first), first)
    se = ratio_se(plateau - full, plateau - bma)[1]
    target = se * np.sqrt(module.MIN_HELD_OUT / 700.5)  # about 700 contexts
    run = module._Discovery(subject, CircuitConfig(n_contexts=16, target_se=float(target)))
    tokens, metric = module.held_out_sample(run)
    assert len(tokens) == module.held_out_size(run.config, plateau, full, bma) == int(np.ceil(512 * (se / target) ** 2))
    assert 650 < len(tokens) < 750 and torch.equal(tokens[:512], first)
    assert not (tokens[512:].unsqueeze(1) == first.unsqueeze(0)).all(-1).any()
    with torch.no_grad():
        assert torch.allclose(metric, per_context_nll(subject.log_probs(tokens), tokens), atol=1e-6)
    run.config = dataclasses.replace(run.config, target_se=1.0)  # the pilot is enough: the sample is the pilot
    tokens, metric = module.held_out_sample(run)
    assert torch.equal(tokens, first) and torch.allclose(metric, full, atol=1e-6)


def _hf_log_probs(subject, hf, tokens, pre_hooks=(), hooks=()):
    """Log-probs of the task's tokens from the Hugging Face GPT-2 itself (no TransformerLens, no
    models.circuit), with torch hooks ``(module, fn)`` on its modules."""
    handles = [m.register_forward_pre_hook(f) for m, f in pre_hooks] + [m.register_forward_hook(f) for m, f in hooks]
    try:
        with torch.no_grad():
            logits = hf(subject.layout.encode(tokens)).logits
    finally:
        for h in handles:
            h.remove()
    first = subject.layout.token_offset
    return logits[:, subject.layout.prediction_positions(), first : first + subject.task.d_vocab].double().log_softmax(-1)


def _hf_outputs(subject, hf, tokens):
    """Per layer, the heads' merged outputs (c_proj's input, ``[batch, T, n_heads * d_head]``) and the MLP's
    output, recorded by torch hooks."""
    store = {}
    pre = [(b.attn.c_proj, lambda m, a, i=i: store.__setitem__(("attn", i), a[0].clone()))
           for i, b in enumerate(hf.transformer.h)]  # fmt: skip
    post = [(b.mlp, lambda m, a, out, i=i: store.__setitem__(("mlp", i), out.clone())) for i, b in enumerate(hf.transformer.h)]
    _hf_log_probs(subject, hf, tokens, pre, post)
    return store


def _hf_with_nodes_replaced(subject, hf, tokens, kept, value):
    """Log-probs with every head and MLP not in ``kept`` replaced by ``value(kind, layer)`` (broadcastable
    to the batch), written on Hugging Face's modules."""
    d_head = hf.config.n_embd // hf.config.n_head

    def heads(m, a, i):
        x = a[0].clone()
        for j in range(hf.config.n_head):
            if f"L{i}H{j}" not in kept:
                cols = slice(j * d_head, (j + 1) * d_head)
                x[..., cols] = value("attn", i)[..., cols].expand_as(x[..., cols])
        return (x,)

    def mlp(m, a, out, i):
        return out if f"MLP{i}" in kept else value("mlp", i).expand_as(out).clone()

    blocks = list(enumerate(hf.transformer.h))
    return _hf_log_probs(subject, hf, tokens, [(b.attn.c_proj, partial(heads, i=i)) for i, b in blocks],
                         [(b.mlp, partial(mlp, i=i)) for i, b in blocks])  # fmt: skip


def test_faithfulness_and_sufficiency_agree_with_huggingface_modules_and_torch_hooks():
    """An independent forward pass: the shipped standard GPT-2's own Hugging Face modules, with torch hooks
    on c_proj (the heads' merged outputs) and on the MLPs. A circuit of nodes (every edge among them): its
    faithfulness under the demonstrations corruption is the run in which every other head and MLP takes its
    value on the corrupted contexts; its sufficiency, every other node at its mean over held-out contexts
    or its value on fresh contexts. models.circuit gives the same per-context NLLs."""
    from models.interp.circuit import among, node_ablated_values

    subject = load_subject("standard")
    hf = subject.model.original_model.eval()
    graph = build_graph(subject)
    task = subject.task
    tokens, _ = task.sample(48, torch.Generator().manual_seed(5))
    reference, _ = task.sample(96, torch.Generator().manual_seed(6))
    fresh, _ = task.sample(48, torch.Generator().manual_seed(7))
    kept = ["L0H1", "L0H3", "L0H6", "MLP0", "L1H2", "L1H4", "MLP1"]
    nll = lambda lp: per_context_nll(lp, tokens)  # noqa: E731
    clean = nll(_hf_log_probs(subject, hf, tokens))
    assert torch.allclose(clean, nll(subject.log_probs(tokens)), atol=1e-5)

    corrupted = other_contexts(task, tokens, "demonstrations", 0)
    on_corrupted = _hf_outputs(subject, hf, corrupted)
    want = nll(_hf_with_nodes_replaced(subject, hf, tokens, kept, lambda k, i: on_corrupted[(k, i)]))
    runner = Runner(subject, graph, tokens, source_writes(subject, graph, tokens, "demonstrations", 0))
    got = runner.keep_only_values(among(graph, kept))
    assert (want - clean).abs().mean() > 0.01  # the corruption reaches the circuit
    assert torch.allclose(got, want, atol=1e-4)

    means = {k: v.mean(0, keepdim=True) for k, v in _hf_outputs(subject, hf, reference).items()}
    for ablation, value in (("mean", lambda k, i: means[(k, i)]), ("resample", None)):
        if ablation == "resample":
            on_fresh = _hf_outputs(subject, hf, fresh)
            value = lambda k, i: on_fresh[(k, i)]  # noqa: E731
        want = nll(_hf_with_nodes_replaced(subject, hf, tokens, kept, value))
        got = node_ablated_values(subject, graph, tokens, kept, ablation, reference if ablation == "mean" else fresh)
        assert (want - clean).abs().mean() > 0.01
        assert torch.allclose(got, want, atol=1e-4), ablation
        share, se = ratio_se(-got, -clean)  # the same ratio from either pass: the same answer, within 1e-4
        assert share == pytest.approx(ratio_se(-want, -clean)[0], abs=1e-3)


def _paired_heavy_tailed(rng, n):
    """Per-context (kept, progress) pairs like a circuit's: correlated, with heavy tails (Student t, 3 dof)."""
    b = 0.6 + 0.3 * rng.standard_t(3, n)
    return 0.9 * b - 0.2 * np.abs(rng.standard_t(3, n)) + 0.1 * rng.standard_normal(n), b


def test_ratio_se_equals_a_numpy_bootstrap_over_contexts_and_the_spread_of_independent_samples():
    """Every share the suite reports is ``ratio_se(a, b)``, mean(a) / mean(b) over the same contexts. Its
    standard error equals a brute-force NumPy bootstrap over contexts (pairs resampled together) to 3%, and
    the spread of the share over 1,000 independent samples to 10%, on paired, heavy-tailed data where an
    error that ignored the denominator or the pairing would be off by more than 30%."""
    rng = np.random.default_rng(0)
    n = 512
    a, b = _paired_heavy_tailed(rng, n)
    share, se = ratio_se(torch.tensor(a), torch.tensor(b))
    assert share == pytest.approx(a.mean() / b.mean(), rel=1e-12)
    idx = rng.integers(0, n, (4000, n))
    boot = (a[idx].mean(1) / b[idx].mean(1)).std()
    assert se == pytest.approx(boot, rel=0.03)
    numerator_only = a.std(ddof=1) / n**0.5 / b.mean()
    unpaired = (a.var(ddof=1) + share**2 * b.var(ddof=1)) ** 0.5 / n**0.5 / b.mean()
    assert min(abs(numerator_only / boot - 1), abs(unpaired / boot - 1)) > 0.3  # the check can tell them apart
    shares, ses = zip(*(ratio_se(*map(torch.tensor, _paired_heavy_tailed(rng, n))) for _ in range(1000)))
    assert np.mean(ses) == pytest.approx(np.std(shares), rel=0.1)


def test_edge_scores_are_keyed_by_edge_and_the_searches_and_roc_auc_read_them_by_edge():
    """EdgeScores keeps each edge's row of per-context scores with the edge itself: read back by edge, its
    means and standard errors are NumPy's of that row; top_n and threshold on ``{edge: score}`` equal a
    NumPy sort and mask of the same numbers in any key order; roc_auc equals the Mann-Whitney U statistic
    from NumPy's average ranks; rows that do not match the edges are refused."""
    from models.interp.circuit import Edge, EdgeScores, top_n
    from models.interp.circuit import threshold as above

    rng = np.random.default_rng(0)
    edges = [Edge(f"L0H{i}", "output", "out", g) for i in range(6) for g in ("demonstrations", "target")]
    values = rng.normal(size=(len(edges), 9)) * rng.uniform(0.01, 1, size=(len(edges), 1))
    values[3] = values[3] * 0  # a tie at zero
    scores = EdgeScores(edges, torch.tensor(values))
    for i, e in enumerate(edges):
        assert torch.equal(scores[e], torch.tensor(values[i]))
    means, with_se = scores.means(), scores.with_se()
    want_mean, want_se = values.mean(1), values.std(1, ddof=1) / np.sqrt(values.shape[1])
    assert list(means) == list(with_se) == edges == list(scores)
    assert np.allclose([means[e] for e in edges], want_mean, atol=1e-15)
    assert np.allclose([with_se[e][1] for e in edges], want_se, atol=1e-15)
    shuffled = {e: means[e] for e in reversed(edges)}  # the searches read scores by edge, not by position
    for n in (0, 1, 5, len(edges)):
        want = {edges[i] for i in np.argsort(-np.abs(want_mean), kind="stable")[:n]}
        assert set(top_n(means, n)) == set(top_n(shuffled, n)) == want
    tau = float(np.median(np.abs(want_mean)))
    assert set(above(shuffled, tau)) == {e for e, m in zip(edges, want_mean) if abs(m) >= tau}
    truth = set(edges[::3])
    x, t = np.abs(want_mean), np.array([e in truth for e in edges])
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(1, len(x) + 1)
    for v in np.unique(x):  # average ranks for ties
        ranks[x == v] = ranks[x == v].mean()
    u = ranks[t].sum() - t.sum() * (t.sum() + 1) / 2
    assert roc_auc({e: abs(m) for e, m in shuffled.items()}, truth) == pytest.approx(u / (t.sum() * (~t).sum()))
    with pytest.raises(ValueError, match="2 rows of values for 12 edges"):
        EdgeScores(edges, torch.zeros(2, 9))


def test_the_threshold_search_keeps_exactly_the_edges_among_the_nodes_whose_score_reaches_it():
    """``--search threshold`` on the transposed circuit: the circuit under each corruption is every edge
    between its nodes whose |score| (as the JSON reports it for every edge) is at least --threshold."""
    subject = transposed_subject(build_task(n_examples=3, seq_len=4, alpha=0.3))
    tau = 1e-3
    r = discover(subject, CircuitConfig(n_contexts=32, n_held_out=64, search="threshold", threshold=tau)).to_dict()
    nodes = set(r["nodes"]) | {"embed", "pos_embed", "output"}
    key = lambda e: (e["sender"], e["receiver"], e["input"], e["group"])  # noqa: E731
    for c, block in r["searches"].items():
        want = {key(e) for e in block["all_edges"] if e["sender"] in nodes and e["receiver"] in nodes
                and abs(e["score"]) >= tau}  # fmt: skip
        assert want and {key(e) for e in block["edges"]} == want, c


def test_exact_edge_scores_equal_plain_torch_hooks_on_the_huggingface_gpt2():
    """Edge level, independently of TransformerLens and of models.interp.circuit's runner: on the shipped
    standard GPT-2, an edge's exact score computed with plain torch hooks on the Hugging Face modules in
    float64 (``bench.auto_circuit_compare.by_hand``: the sender's corrupted-minus-clean write added to that one
    receiver input at the edge's positions, the receiver recomputed) equals ``exact_scores``'s, for edges from
    every kind of sender into every kind of input at both groups of positions. (A by-hand check of this kind
    found that a 1.4e-4 gap to auto-circuit was the comparison's, not ours: docs/results/circuit.md.)"""
    import transformers

    from bench.auto_circuit_compare import by_hand, contexts_record, edge_record

    subject = load_subject("standard")
    hf = transformers.GPT2LMHeadModel.from_pretrained(models.STANDARD_CHECKPOINT).double().eval()  # its own modules
    graph = build_graph(subject)
    tokens, _ = subject.task.sample(16, torch.Generator().manual_seed(3))
    corrupted = other_contexts(subject.task, tokens, "demonstrations", 0)
    runner = Runner(subject, graph, tokens, source_writes(subject, graph, tokens, "demonstrations", 0))
    edges = [e for e in graph.edges if e.sender in ("embed", "L0H2", "MLP0")]
    assert {graph.receiver_of(e).input for e in edges} >= {"q", "k", "v", "in", "out"}
    assert {e.group for e in edges} >= {"demonstrations", "target"}
    ours = exact_scores(runner, edges).means()
    record = contexts_record(subject, tokens, corrupted)
    hand = {e: by_hand(hf, record, edge_record(graph, e), torch) for e in edges}
    assert max(abs(v) for v in hand.values()) > 0.01  # the corruption reaches these edges
    worst = max(edges, key=lambda e: abs(ours[e] - hand[e]))
    assert abs(ours[worst] - hand[worst]) < 1e-6, (str(worst), ours[worst], hand[worst])
