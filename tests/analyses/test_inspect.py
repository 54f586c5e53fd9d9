"""analyses.inspect: credits the paper's circuit where it is, names the heads of another circuit with
their roles, and reports plateau models as such with no head credited."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import build_task
from constructed import one_copyer_nanogpt_state, transposed_subject
from test_formats import file_config, hf_folder

import models
from analyses import common, inspect
from models.interp.inspection import corrupt, inspect_subject
from models.interp.subject import load_subject, subject_of
from probes import bma_posterior, bma_predictive


def _subject(model, task):
    return subject_of(model, task, None, "test", "0")


def test_the_transposed_circuit_stub_is_bma():
    task = build_task(n_examples=4, seq_len=6, alpha=0.3)
    subject = transposed_subject(task)
    tokens, _ = task.sample(32, torch.Generator().manual_seed(5))
    want = bma_predictive(task.pi, tokens, 4, 6, task.root, log=True)
    assert torch.allclose(subject.log_probs(tokens)[:, 1:], want[:, 1:].double(), atol=1e-9)


def test_theorem1_model_is_credited_with_its_parent_head_and_copyers():
    task = build_task(n_examples=4, seq_len=6)
    model = models.theorem1_model(task.pi, 4, 6, beta=50)
    r = inspect_subject(_subject(model, task), n_contexts=256, seed=0)
    assert r["progress"] > 0.99 and not r["on_plateau"]
    assert r["parent_selecting"] == ["L1H0"]
    assert r["copyers"] == {f"L0H{k}": k for k in range(4)}  # Theorem 1: head k copies demonstration k
    head = r["heads"][-1]
    assert head["tv"] < 1e-6 and abs(head["parent_acc"] - r["acc_bma"]) < 1e-12
    assert r["paper_circuit"] and r["carriers"][0] == "L1H0"
    assert r["roles"] == {"L1H0": "parent selector", **{f"L0H{k}": f"copyer of demonstration {k}" for k in range(4)}}
    # The parent selector acts through its keys and queries: its values read the target's own tokens,
    # which the corruption (demonstrations from another tree) keeps, so they carry nothing.
    assert r["inputs"]["L1H0"]["through"] == "keys/queries" and r["inputs"]["L1H0"]["v"]["cost"] == 0
    assert r["inputs"]["L1H0"]["k"]["cost"] > 0 and r["inputs"]["L1H0"]["q"]["cost"] > 0
    # The profile of the parent head, by brute force on the BMA posterior it equals: mass on the true parent.
    tokens, parents = task.sample(256, torch.Generator().manual_seed(0))
    post = bma_posterior(task.pi, tokens, 4, 6)
    want = post[:, 1:].gather(-1, parents[:, 1:].unsqueeze(-1)).mean().item()
    assert abs(head["role_profile"]["parent"][1] - want) < 1e-6
    assert np.isnan(head["role_profile"]["parent"][0])  # the disentangled model has no demonstration query


def test_a_non_paper_circuit_gets_its_heads_named_with_their_roles():
    task = build_task(n_examples=4, seq_len=6, alpha=0.3)
    r = inspect_subject(transposed_subject(task), n_contexts=256, seed=0)
    assert r["progress"] > 0.999 and not r["on_plateau"]
    assert not r["paper_circuit"] and r["parent_selecting"] == [] and r["copyers"] == {}
    assert sorted(r["carriers"]) == ["L0H0", "L0H1", "L1H0"] and not r["carriers_distributed"]
    assert r["roles"]["L0H0"].startswith("within-sequence (prefix) head")
    assert r["roles"]["L0H1"].startswith("within-sequence (prefix) head")
    # Measured, not read off its attention: L1H0's effect goes through its value input alone (its queries
    # and keys read positions only), so it is named for the mechanism, beside its attention role.
    assert r["roles"]["L1H0"].startswith(f"{inspect.POOLING} (cross-demonstration same-position reader [")
    assert r["inputs"]["L1H0"]["through"] == "values" and r["inputs"]["L1H1"]["through"] is None
    assert r["inputs"]["L1H0"]["q"]["cost"] == 0 and r["inputs"]["L1H0"]["k"]["cost"] == 0
    # Its value cost by a hand-written hook: layer 1's input subspace S (MLP0's write, which only L1H0's
    # value reads) set to its value on the corrupted contexts.
    n = r["intervention_contexts"]
    tokens, _ = task.sample(256, torch.Generator().manual_seed(0))
    tokens = tokens[:n]
    bad = corrupt(task, tokens, 0)
    subject = transposed_subject(task)
    S = subject.model.sub["S"]
    store = {}
    subject.log_probs(bad, [("blocks.1.hook_resid_pre", lambda x, hook: store.update(S=x[..., S].clone()))])

    def swap(x, hook):
        x = x.clone()
        x[..., S] = store["S"]
        return x

    from probes import target_nll as nll

    want = nll(subject.log_probs(tokens, [("blocks.1.hook_resid_pre", swap)]), tokens) - nll(subject.log_probs(tokens), tokens)
    assert want > 0.05 and abs(r["inputs"]["L1H0"]["v"]["cost"] - want) < 1e-9
    heads = {h["label"]: h for h in r["heads"]}
    assert heads["L1H1"]["ablation_dnll"] == 0  # it writes nothing
    # L0H1 feeds the read-out the target's own prefix: its mean ablation costs, but corrupting the
    # demonstrations (the target kept) leaves its output unchanged, so patching it restores nothing.
    assert heads["L0H1"]["ablation_dnll"] > 0.01 and heads["L0H1"]["patching_restored"] == 0
    assert heads["L1H0"]["patching_restored"] > 0.999  # its clean output carries everything the demos give
    # L1H0 from the target queries predicting x_1..x_5: all on position h of the demonstrations, 1/L on
    # each (no single copy); the query predicting the root x_0 attends to itself.
    assert abs(heads["L1H0"]["role_profile"]["same_position"][1] - 5 / 6) < 1e-12
    assert abs(heads["L1H0"]["role_profile"]["self"][1] - 1 / 6) < 1e-12
    assert np.allclose(heads["L1H0"]["copy_mass"], 5 / 6 / 4)
    text = inspect.summary(r)
    assert "paper's circuit is absent" in text and f"L1H0 ({inspect.POOLING} (cross-demonstration" in text
    assert "L1H0: v 1.00 +- 0.00, k 0.00 +- 0.00, q 0.00 +- 0.00" in text


def _plateau_model(task, w_kq_from_theorem1: bool, noise: float = 0.0):
    """Copyers of Theorem 1; W_OV = log pi; W_KQ zero (+ noise), or Theorem 1's with W_OV zeroed."""
    model = models.theorem1_model(task.pi, task.n_examples, task.seq_len, beta=50)
    with torch.no_grad():
        if w_kq_from_theorem1:
            model.blocks[1].attn.W_OV.zero_()  # attention selects parents, the output ignores it
        else:
            model.blocks[1].attn.W_KQ.copy_(noise * torch.randn_like(model.W_KQ))
    return model


def test_uniform_attention_model_sits_exactly_on_the_plateau():
    task = build_task(n_examples=4, seq_len=6)
    # 512 contexts: on 128, BMA beats the plateau by 0.0073 +- 0.0043 nats, within 2 SE: no progress measured
    r = inspect_subject(_subject(_plateau_model(task, False), task), n_contexts=512, seed=1)
    # Independent computation of the plateau NLL: mean over h' < h of pi(. | x_h'), in NumPy.
    tokens, _ = task.sample(512, torch.Generator().manual_seed(1))
    pi, t = task.pi.numpy(), tokens[:, -6:].numpy()
    nll = -np.mean([np.log(pi[t[b, :h], t[b, h]].mean()) for b in range(512) for h in range(1, 6)])
    assert abs(r["nll"] - nll) < 1e-9 and abs(r["nll_uniform"] - nll) < 1e-9
    assert r["on_plateau"] and r["parent_selecting"] == [] and r["carriers"] == [] and not r["paper_circuit"]
    text = inspect.summary(r)
    assert not r["worse_than_plateau"] and "ON THE UNIFORM-PARENT PLATEAU (progress 0.000 +- 0.000, below 0.1" in text
    _assert_verdict_follows_from_measurements(r)


def test_plateau_models_get_no_credit_even_when_a_head_scores_best_among_bad_ones():
    task = build_task(n_examples=4, seq_len=6)
    # 512 contexts, so that BMA's gap over the plateau is beyond 2 SE (not on 128) and a progress is measured
    noisy = inspect_subject(_subject(_plateau_model(task, False, noise=0.3), task), n_contexts=512, seed=2)
    assert noisy["on_plateau"] and noisy["parent_selecting"] == [] and noisy["best_head"] and noisy["carriers"] == []
    # A head whose attention is exactly BMA's, in a model whose output ignores it: still no credit.
    deaf = inspect_subject(_subject(_plateau_model(task, True), task), n_contexts=512, seed=2)
    assert deaf["heads"][-1]["tv"] < 1e-6
    assert deaf["progress"] < 0 and deaf["on_plateau"] and deaf["parent_selecting"] == [] and deaf["carriers"] == []
    # Its NLL is above the plateau's: the verdict says so, with the margin, and not "on the plateau".
    margin = deaf["nll"] - deaf["nll_uniform"]
    text = inspect.summary(deaf)
    assert deaf["worse_than_plateau"] and margin > 0.01
    assert f"WORSE THAN THE UNIFORM-PARENT PLATEAU (its NLL is {margin:.4f} nats above" in text
    assert "ON THE UNIFORM-PARENT PLATEAU" not in text.replace("WORSE THAN THE UNIFORM-PARENT PLATEAU", "")
    _assert_verdict_follows_from_measurements(noisy)
    _assert_verdict_follows_from_measurements(deaf)


def _assert_verdict_follows_from_measurements(r):
    """The report's labels hold by its own measurements and printed thresholds: ON THE PLATEAU only where
    the progress is below its bar by 2 SE; THE PAPER'S CIRCUIT only where its heads alone keep the progress;
    every head whose mean ablation costs > 3 SE is named (a carrier, or on the plateau among the costly
    heads), with the thresholds printed."""
    text, t = inspect.summary(r), r["thresholds"]
    assert "thresholds behind the verdict: plateau_progress 0.1, off_plateau_progress 0.5" in text
    if "ON THE UNIFORM-PARENT PLATEAU" in text:
        assert r["progress"] + 2 * r["progress_se"] < t["plateau_progress"]
    if "THE PAPER'S CIRCUIT" in text:
        assert r["sufficiency"]["paper_circuit"]["share"] >= t["sufficient"]
    for h in r["heads"]:
        if h["ablation_dnll"] > t["cost_z"] * h["ablation_se"]:
            assert h["label"] in r["carriers"] or h["label"] in r["costly_heads"]
            assert f"{h['label']} (" in text


def _hand_ablation_cost(subject, tokens, layer, head):
    """Per context, the NLL change when ``head`` of ``layer`` has its hook_z at its mean over ``tokens``
    (a hand-written hook)."""
    from probes.metrics import per_context_nll

    def mean_head(z, hook):
        z = z.clone()
        z[:, :, head] = z[:, :, head].mean(0, keepdim=True)
        return z

    ablated = subject.log_probs(tokens, [(f"blocks.{layer}.attn.hook_z", mean_head)])
    return per_context_nll(ablated, tokens) - per_context_nll(subject.log_probs(tokens), tokens)


def test_a_model_leaving_the_plateau_credits_the_heads_its_measurements_find():
    """The transposed circuit with L1H0's write scaled down to 0.12 (the read-out's posterior tempered):
    progress about 0.35. The old verdict called it ON THE PLATEAU with no head credited; now it is LEAVING
    THE PLATEAU, L1H0 (whose mean ablation, by a hand-written hook, costs > 3 SE) is credited, and the
    progress has its standard error."""
    task = build_task(n_examples=4, seq_len=6, alpha=0.3)
    subject = transposed_subject(task)
    with torch.no_grad():
        subject.model.blocks[1].attn.W_O[0] *= 0.12
    r = inspect_subject(subject, n_contexts=128, seed=0)
    assert 0.2 < r["progress"] < 0.5 and 0 < r["progress_se"] < 0.05
    assert r["regime"] == "leaving" and r["on_plateau"] is False
    tokens, _ = task.sample(128, torch.Generator().manual_seed(0))
    cost = _hand_ablation_cost(subject, tokens, 1, 0)
    heads = {h["label"]: h for h in r["heads"]}
    assert heads["L1H0"]["ablation_dnll"] == pytest.approx(cost.mean().item(), abs=1e-9)
    assert heads["L1H0"]["ablation_se"] == pytest.approx((cost.std() / 128**0.5).item(), rel=1e-6)
    assert cost.mean() > 3 * cost.std() / 128**0.5 and "L1H0" in r["carriers"]
    text = inspect.summary(r)
    assert "LEAVING THE PLATEAU (progress 0.3" in text and "ON THE UNIFORM-PARENT PLATEAU" not in text
    _assert_verdict_follows_from_measurements(r)


def test_verdicts_on_a_nanogpt_checkpoint_follow_from_its_measurements(tmp_path):
    """An untrained nanoGPT checkpoint (written as nanoGPT's train.py writes it): the report's labels follow
    from its measurements (no plateau label without the progress below its bar, no paper's circuit without
    sufficiency, every costly head named). A nanoGPT model with one copyer: the next test."""
    from test_formats_pipelines import SPECIAL, write_nanogpt

    task = build_task(n_examples=3, seq_len=4)
    path, _, _ = write_nanogpt(tmp_path / "nano", task, SPECIAL)
    subject = load_subject(path)
    r = inspect_subject(subject, n_contexts=128, seed=0)
    _assert_verdict_follows_from_measurements(r)
    assert not r["paper_circuit"] or r["sufficiency"]["paper_circuit"]["share"] >= r["thresholds"]["sufficient"]


def test_one_copyer_for_three_demonstrations_is_not_called_the_papers_circuit(tmp_path):
    """A nanoGPT checkpoint (ckpt.pt in nanoGPT's format) whose circuit looks like the paper's but has ONE
    copyer for its three demonstrations (``constructed.one_copyer_nanogpt_state``): L0H0 copies x_h of
    demonstration 0, L0H1 (not a copyer) brings that demonstration's x_h' to the candidates, L1H0 selects the
    parent from that one demonstration. The issue's failure: THE PAPER'S CIRCUIT printed for 1 copyer while its
    own sufficiency line said the circuit keeps -0.028 +- 0.094. Every number the verdict rests on is
    recomputed here with nanoGPT's own equations (``nanogpt_logits``, plain torch on the checkpoint's tensors)
    and the plateau in NumPy, not through the suite's code."""
    from test_formats_pipelines import expected_log_probs, nanogpt_logits, write_task

    task = build_task(d_vocab=4, n_examples=3, seq_len=5, alpha=0.1)
    L, H = task.n_examples, task.seq_len
    state, args = one_copyer_nanogpt_state(task, demo=0)
    (tmp_path / "nano").mkdir()
    ckpt = {"model": state, "model_args": args, "iter_num": 0, "best_val_loss": torch.tensor(0.0), "config": {}}
    torch.save(ckpt, tmp_path / "nano" / "ckpt.pt")
    write_task(tmp_path / "nano", task, {})
    r = inspect_subject(load_subject(tmp_path / "nano" / "ckpt.pt"), n_contexts=256, seed=0)
    text = inspect.summary(r)

    n = r["intervention_contexts"]
    tokens = task.sample(256, torch.Generator().manual_seed(0))[0][:n]  # the contexts inspect intervenes on
    target = tokens[:, -H:, None]

    def nll(heads=None):  # per context, mean over x_1..x_{H-1}, by nanoGPT's equations
        lp = expected_log_probs(lambda ids: nanogpt_logits(state, args, ids, torch.float64, heads), tokens, task, {})
        return -lp.gather(-1, target)[:, 1:, 0].mean(1)

    def mean_ablated(keep):  # every head not in keep: its output at its mean over the contexts, per position
        def edit(layer, att, y):
            y = y.clone()
            for j in range(args["n_head"]):
                if f"L{layer}H{j}" not in keep:
                    y[:, j] = y[:, j].mean(0, keepdim=True)
            return y

        return edit

    labels = [f"L{i}H{j}" for i in range(2) for j in range(args["n_head"])]
    clean = nll()
    cost = {x: nll(mean_ablated(set(labels) - {x})) - clean for x in labels}
    se = {x: (c.std() / n**0.5).item() for x, c in cost.items()}
    costly = {x for x, c in cost.items() if c.mean() > r["thresholds"]["cost_z"] * se[x]}
    heads = {h["label"]: h for h in r["heads"]}
    for x in labels:  # the report's costs are these
        assert heads[x]["ablation_dnll"] == pytest.approx(cost[x].mean().item(), abs=1e-5)
    assert costly == {"L0H0", "L0H1", "L1H0"}  # the copyer, the demonstration reader and the selector
    for x in costly:  # each named in the report: every head costing > 3 SE
        assert x in r["carriers"] and f"{x} (" in text

    # The copyers: by nanoGPT's attention, heads putting >= copy_mass on x_h of one demonstration from the
    # query predicting the target's x_h. Exactly one, and the report prints that one and no other.
    seen = {}

    def keep_attention(layer, att, y):
        seen[layer] = att  # [B, head, query, key]
        return y

    nanogpt_logits(state, args, tokens, torch.float64, keep_attention)
    rows = torch.tensor([L * H + h - 1 for h in range(H)])
    copy = torch.stack([seen[0][:, :, rows, torch.arange(H) + l * H].mean((0, 2)) for l in range(L)], -1)  # [head, l]
    bar = r["thresholds"]["copy_mass"]
    copyers = {f"L0H{j}": int(copy[j].argmax()) for j in range(args["n_head"]) if copy[j].max() >= bar}
    assert copyers == {"L0H0": 0} == r["copyers"]
    assert "paper's circuit, copyers: L0H0->demo 0\n" in text
    # The copyer printed is the one layer-0 head that both copies and costs > 3 SE; the other costly layer-0
    # head reads position h - 1 (a copyer's query and the candidates' keys need tokens one position apart).
    assert len(r["copyers"]) == len(costly & set(copyers)) == 1
    assert sorted(x for x in costly if x.startswith("L0")) == ["L0H0", "L0H1"] and copy[1].max() < 0.05

    # Its attention looks like the paper's circuit (a copyer and a parent selector), so only sufficiency
    # can refuse the label. Sufficiency by hand: the copyer and the selector alone, every other head
    # mean-ablated, against the uniform-parent plateau computed in NumPy.
    assert r["paper_circuit_attention"] and r["parent_selecting"] == ["L1H0"] and r["regime"] == "leaving"
    pi, t = task.pi.numpy(), tokens[:, -H:].numpy()
    plateau = torch.tensor([-np.mean([np.log(pi[t[b, :h], t[b, h]].mean()) for h in range(1, H)]) for b in range(n)])
    kept = nll(mean_ablated({"L0H0", "L1H0"}))
    share = ((plateau - kept).mean() / (plateau - clean).mean()).item()
    suff = r["sufficiency"]["paper_circuit"]
    assert suff["heads"] == ["L0H0", "L1H0"] and suff["share"] == pytest.approx(share, abs=1e-4)
    assert share < 0 < r["thresholds"]["sufficient"]  # the selector reads nothing without L0H1: below the plateau
    assert not r["paper_circuit"] and "THE PAPER'S CIRCUIT" not in text
    assert f"but its heads alone keep {suff['share']:.3f} +- {suff['se']:.3f} of the progress, below 0.8" in text
    _assert_verdict_follows_from_measurements(r)


def test_standard_model_candidate_attention_matches_hugging_face(tmp_path):
    from transformers import GPT2LMHeadModel

    folder, _, task = hf_folder(tmp_path, build_task(n_examples=4, seq_len=6, alpha=0.3))
    subject = load_subject(folder)
    hf = GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()
    tokens, _ = task.sample(4, torch.Generator().manual_seed(3))
    att = hf(tokens, output_attentions=True).attentions  # [batch, head, query, key] per layer
    L, H = task.n_examples, task.seq_len
    for layer, mine in enumerate(subject.attention(tokens)):
        rows = mine.target_rows(L, H)
        for h in range(H):
            want = att[layer][:, :, L * H + h - 1]
            assert torch.allclose(rows[:, :, h].float(), want, atol=1e-5)
    r = inspect_subject(subject, n_contexts=128, seed=0)  # untrained
    assert r["nll_uniform"] - r["nll_bma"] > 0.02  # demonstrations matter on this task
    assert r["kind"] == "standard" and len(r["heads"]) == 4 and r["on_plateau"] and not r["parent_selecting"]
    assert r["carriers"] == []


def test_cli_on_a_pt_file_writes_the_report(tmp_path, capsys):
    task = build_task(n_examples=4, seq_len=6, alpha=0.3)
    model = models.theorem1_model(task.pi, 4, 6, beta=50)
    torch.save(model.state_dict(), tmp_path / "w.pt")
    (tmp_path / "cfg.json").write_text(json.dumps(file_config(model, task)))
    r = inspect.main(
        [
            "--checkpoint",
            str(tmp_path / "w.pt"),
            "--config",
            str(tmp_path / "cfg.json"),
            "--n-contexts",
            "128",
            "--out",
            str(tmp_path / "out"),
        ]
    ).data
    assert r["parent_selecting"] == ["L1H0"]
    saved = json.loads((tmp_path / "out" / "inspect.json").read_text())
    assert saved["results"]["progress"] == r["progress"] and saved["checkpoint_hash"]
    for stem in inspect.FIGURES:
        assert (tmp_path / "out" / stem).is_file()
    out = capsys.readouterr().out
    assert "parent-selecting heads: L1H0" in out and "THE PAPER'S CIRCUIT" in out
    # The report only formats the measurement: the saved JSON alone, with no model, prints the same report.
    assert inspect.summary(saved["results"]) in out
    # The heads it names link to the discovered circuit: not computed yet for this checkpoint, so no path, and
    # the command that writes it (tests/analyses/test_inspect_sentences.py: the path once the file exists).
    assert saved["results"]["circuit_link"]["json"] is None
    want = f"not computed for this model yet; python -m analyses.circuit --checkpoint {tmp_path / 'w.pt'} writes it"
    assert want in out and "circuit.json" not in out


def test_the_standard_gpt2_links_to_its_committed_circuit(monkeypatch):
    committed = json.loads((common.FIGURES_DIR / "circuit.json").read_text())
    monkeypatch.chdir(common.FIGURES_DIR.parent)
    assert inspect.circuit_link("standard", committed["checkpoint_hash"])["json"] == "figures/circuit.json"
