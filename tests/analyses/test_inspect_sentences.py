"""analyses.inspect says only what its numbers support (``models.interp.inspection.SENTENCES``): no
sufficiency when nothing was ablated, no share of a denominator within 2 SE of zero (a head's input cost,
the clean-vs-corrupted difference, the gain a sufficiency divides, the plateau-to-BMA gap), below the
plateau what to check first and no head credited, a carrier only on a cost or share beyond 2 SE, and a
path to the discovered circuit only where that file is. Each case is one the issue found (issue 45; the
share of nothing: issue 41)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import build_task
from constructed import TransposedCircuit
from test_inspect import _hand_ablation_cost, _plateau_model, _subject

import models
from analyses import common, inspect
from models.interp.inspection import SENTENCES, THRESHOLDS, inspect_subject, verdict
from models.interp.subject import StandardSubject
from probes import Layout, bma_predictive
from probes.roles import CATEGORIES


def _se(x: torch.Tensor) -> float:
    return (x.std() / len(x) ** 0.5).item()


def test_every_rule_of_the_report_is_written_down():
    """The rule table names the sentences this file checks, each with the numbers that guard it."""
    assert {"progress", "worse", "plateau", "no_progress", "plateau_heads", "carrier", "share", "sufficiency",
            "paper_circuit", "circuit_link"} <= set(SENTENCES)  # fmt: skip
    assert all("2 SE" in SENTENCES[k] for k in ("progress", "worse", "plateau", "carrier", "share", "sufficiency"))


def test_no_sufficiency_is_printed_when_every_head_is_named_and_nothing_was_ablated():
    """Theorem 1 with 4 demonstrations: the paper's circuit is all 5 heads (4 copyers, the selector). Before,
    'every other head mean-ablated keeps 1.000 +- 0.000': nothing was ablated."""
    task = build_task(n_examples=4, seq_len=6)
    model = models.theorem1_model(task.pi, 4, 6, beta=50)
    subject = _subject(model, task)
    r = inspect_subject(subject, n_contexts=256, seed=0)
    every = [f"L{i}H{j}" for i, n in enumerate(subject.n_heads) for j in range(n)]
    suff = r["sufficiency"]["paper_circuit"]
    assert sorted(suff["heads"]) == sorted(every) == sorted(set(r["copyers"]) | set(r["parent_selecting"]))
    text = inspect.summary(r)
    assert "keeps 1.000 +- 0.000" not in text and "alone keep 1.000" not in text
    assert suff["ablated"] == [] and suff["share"] is None and "none is ablated" in suff["refused"]
    assert "sufficiency of the paper circuit (L0H0, L0H1, L0H2, L0H3, L1H0): none measured: every head" in text
    # The paper's circuit is still named: its heads are all there is, and the model is off the plateau.
    assert r["paper_circuit"] and "its heads are every head of the model" in text


def test_a_carrier_is_credited_only_on_an_effect_beyond_two_standard_errors():
    """The same model: before, L0H1 was named as carrying the computation on an ablation cost of 0.0022 +-
    0.0022 nats (and a patching share of 0.06). Now a head whose mean-ablation cost (by a hand-written hook)
    is within 2 SE of zero and whose patching share is below the bar is no carrier."""
    task = build_task(n_examples=4, seq_len=6)
    subject = _subject(models.theorem1_model(task.pi, 4, 6, beta=50), task)
    r = inspect_subject(subject, n_contexts=256, seed=0)
    tokens = task.sample(256, torch.Generator().manual_seed(0))[0][: r["intervention_contexts"]]
    heads = {h["label"]: h for h in r["heads"]}
    weak = []
    for label in heads:
        layer, head = int(label[1]), int(label[3:])
        cost = _hand_ablation_cost(subject, tokens, layer, head)
        assert heads[label]["ablation_dnll"] == pytest.approx(cost.mean().item(), abs=1e-9)
        if not cost.mean() > 2 * _se(cost) and heads[label]["patching_restored"] < THRESHOLDS["carry_fraction"][0]:
            weak.append(label)
    assert weak and not set(weak) & set(r["carriers"]), (weak, r["carriers"])
    assert "L1H0" in r["carriers"]


def test_no_share_of_an_input_cost_within_two_standard_errors_of_zero(tmp_path):
    """An untrained nanoGPT checkpoint: a last-layer head whose inputs' summed cost is within 2 SE of zero
    got 'v 0.67 +- 0.19 of its inputs' cost (0.006 +- 0.011 nats)'; now its cost, and no shares."""
    from test_formats_pipelines import SPECIAL, write_nanogpt

    task = build_task(n_examples=3, seq_len=4)
    path, _, _ = write_nanogpt(tmp_path / "nano", task, SPECIAL)
    r = inspect_subject(models.load_subject(path), n_contexts=128, seed=0)
    text = inspect.summary(r)
    within = [label for label, h in r["inputs"].items() if h["cost"] and not h["cost"] > 2 * h["se"]]
    assert within  # the case exists on this model
    for label, h in r["inputs"].items():
        line = next(x for x in text.splitlines() if x.strip().startswith(f"{label}:"))
        if label in within:
            assert all(h[x]["share"] is None for x in "vkq") and h["through"] is None
            assert "of its inputs' cost (" not in line and "not beyond 2 SE of zero: no share" in line
        else:
            assert "of its inputs' cost (" in line


def test_no_patching_share_of_a_clean_vs_corrupted_difference_within_two_standard_errors(tmp_path):
    """The same untrained checkpoint: corrupting the demonstrations changes its NLL by less than 2 SE (per
    context, by nanoGPT's own equations), so no head is said to restore a share of it."""
    from test_formats_pipelines import SPECIAL, expected_log_probs, nanogpt_logits, write_nanogpt

    from models.interp.inspection import corrupt

    task = build_task(n_examples=3, seq_len=4)
    path, state, args = write_nanogpt(tmp_path / "nano", task, SPECIAL)
    r = inspect_subject(models.load_subject(path), n_contexts=128, seed=0)
    tokens = task.sample(128, torch.Generator().manual_seed(0))[0][: r["intervention_contexts"]]
    bad = corrupt(task, tokens, 0)

    def nll(t):  # per context, by nanoGPT's equations
        lp = expected_log_probs(lambda ids: nanogpt_logits(state, args, ids, torch.float64), t, task, SPECIAL)
        return -lp.gather(-1, t[:, -task.seq_len :, None])[:, 1:, 0].mean(1)

    effect = nll(bad) - nll(tokens)
    assert not effect.mean() > 2 * _se(effect)
    assert all(h["patching_restored"] is None for h in r["heads"]) and r["patching_refused"]
    text = inspect.summary(r)
    assert f"patching: no shares (corrupting the demonstrations changes the NLL by {effect.mean():+.4f}" in text


@pytest.mark.parametrize("w_kq_from_theorem1", [False, True])
def test_a_share_of_nothing_is_refused_for_the_sufficiency(w_kq_from_theorem1):
    """Theorem 1's copyers with a layer 2 that ignores them (uniform attention: exactly the plateau), or
    that selects parents but writes nothing (below the plateau): the copyers' sufficiency divided a gain of 0
    (or below 0). Now no share, one line saying why, and the reason in the JSON (issue 41)."""
    task = build_task(n_examples=4, seq_len=6)
    subject = _subject(_plateau_model(task, w_kq_from_theorem1), task)
    r = inspect_subject(subject, n_contexts=512, seed=2)
    tokens = task.sample(512, torch.Generator().manual_seed(2))[0][: r["intervention_contexts"]]
    pi, t = task.pi.numpy(), tokens[:, -6:].numpy()  # the plateau per context, in NumPy
    plateau = torch.tensor([-np.mean([np.log(pi[t[b, :h], t[b, h]].mean()) for h in range(1, 6)]) for b in range(len(t))])
    with torch.no_grad():
        lp = subject.log_probs(tokens)
    gain = plateau + lp.gather(-1, tokens[:, -6:, None])[:, 1:, 0].mean(1)  # plateau NLL - model NLL
    assert not (gain.mean() > 2 * _se(gain) and gain.mean() > 1e-6)  # 1e-6: float rounding (the uniform model)
    suff = r["sufficiency"]["paper_circuit"]
    assert suff["share"] is None and suff["se"] is None and "share of nothing" in suff["refused"]
    assert suff["heads"] == ["L0H0", "L0H1", "L0H2", "L0H3"]
    text = inspect.summary(r)
    line = next(x for x in text.splitlines() if x.startswith("sufficiency of the paper circuit"))
    assert "none measured: the model's gain over the uniform-parent plateau" in line and "keeps" not in line


class OffsetTransposed(TransposedCircuit):
    """The transposed circuit (exact BMA) as a model trained with every task token s at input id s + 1 (id 0
    never seen, never predicted): read with ``Layout(token_offset=1)`` it is BMA; read as a task.json
    without its ``layout`` reads it (id s is token s), it sees every token shifted by one."""

    def __init__(self, task):
        super().__init__(task)
        self.layout = Layout(task.n_examples, task.seq_len, task.d_vocab, token_offset=1)

    def forward(self, ids):
        log_probs = super().forward((ids - 1).clamp_min(0))  # [b, T, d] over tokens 0..d-1
        return torch.cat([torch.full_like(log_probs[..., :1], -10.0), log_probs], -1)  # [b, T, 1 + d] over ids


def test_below_the_plateau_the_report_says_what_to_check_first_and_credits_no_head():
    """A model read without its layout (the issue: a task.json without ``layout``, NLL 5.0 against the
    plateau's 0.98): WORSE THAN THE PLATEAU, then what to check first (the layout, the token offset), and
    no head said to 'compute the plateau's own prediction'. Read with its layout, the same model is BMA."""
    task = build_task(n_examples=4, seq_len=6, alpha=0.3)
    model = OffsetTransposed(task)
    right = inspect_subject(StandardSubject(model, task, model.layout, "offset", "0"), n_contexts=256, seed=0)
    assert right["progress"] > 0.999  # its own layout: BMA
    plain = Layout(task.n_examples, task.seq_len, task.d_vocab)  # what a task.json without `layout` gives
    r = inspect_subject(StandardSubject(model, task, plain, "offset, no layout", "0"), n_contexts=256, seed=0)
    assert r["progress"] + 2 * r["progress_se"] < 0 and r["worse_than_plateau"]
    text = inspect.summary(r)
    verdict_line = inspect.circuit_text(r)
    assert verdict_line.startswith("WORSE THAN THE UNIFORM-PARENT PLATEAU") and verdict_line in text
    assert "check first" in verdict_line and "layout" in verdict_line and "token_offset" in verdict_line
    assert "read now with the layout the task's own (no BOS, no separator, token_offset 0)" in verdict_line
    assert "plateau's own prediction" not in text and r["carriers"] == [] and not r["paper_circuit"]
    # every costly head is still named, as a measurement and not a mechanism
    for c in r["costly_heads"]:
        assert f"{c} (" in verdict_line


def test_no_progress_is_printed_on_a_plateau_gap_within_two_standard_errors():
    """The uniform-attention model on 128 contexts: BMA beats the plateau by less than 2 SE (in NumPy and
    by the oracle, per context), so its progress is a share of nothing; before, 'ON THE UNIFORM-PARENT
    PLATEAU (progress 0.000 +- 0.000, ...'."""
    task = build_task(n_examples=4, seq_len=6)
    r = inspect_subject(_subject(_plateau_model(task, False), task), n_contexts=128, seed=1)
    tokens = task.sample(128, torch.Generator().manual_seed(1))[0]
    pi, t = task.pi.numpy(), tokens[:, -6:].numpy()
    plateau = torch.tensor([-np.mean([np.log(pi[t[b, :h], t[b, h]].mean()) for h in range(1, 6)]) for b in range(128)])
    bma = bma_predictive(task.pi, tokens, 4, 6, task.root, log=True)
    gap = plateau + bma.gather(-1, tokens[:, -6:, None])[:, 1:, 0].mean(1)
    assert gap.mean() > THRESHOLDS["min_plateau_gap"][0] and not gap.mean() > 2 * _se(gap)
    assert r["progress"] is None and r["on_plateau"] is None and r["carriers"] == []
    text = inspect.summary(r)
    assert "progress from the plateau to BMA" not in text and "ON THE UNIFORM-PARENT PLATEAU" not in text
    assert "no progress is measured and no head can be credited" in text


def _verdict(progress: float, se: float) -> dict:
    """The verdict of one head's measurements at a given progress and standard error (a 1-nat gap)."""
    head = {"label": "L0H0", "candidate_mass": 0.0, "tv": 0.5, "parent_acc": 0.3, "copy_mass": [0.1],
            "role_profile": {c: [0.0, float(c == "prefix")] for c in CATEGORIES}, "ablation_dnll": 0.0, "ablation_se": 0.01,
            "patching_restored": None, "patching_se": None}  # fmt: skip
    base = {"nll_uniform": 2.0, "nll_bma": 1.0, "acc_uniform": 0.3, "acc_bma": 0.9, "tv_uniform": 0.5}
    inter = {"nll_clean": 0.0, "nll_corrupted": 0.0}
    r = verdict(2.0 - progress, base, [head], inter, progress_se=se)
    r.update(heads=[{**head, "role": "x"}], nll=2.0 - progress, **base, layout=None)
    return r


@pytest.mark.parametrize("progress, se, words", [
    (-0.01, 0.1, "NO PROGRESS BEYOND ITS STANDARD ERROR (progress -0.010 +- 0.100"),  # was: ON THE PLATEAU, below 0.1 by 2 SE
    (0.05, 0.04, "NO PROGRESS BEYOND ITS STANDARD ERROR (progress 0.050 +- 0.040"),  # was: LEAVING THE PLATEAU
    (0.02, 0.01, "ON THE UNIFORM-PARENT PLATEAU (progress 0.020 +- 0.010, below 0.1 by more than 2 SE)"),
    (-0.5, 0.1, "WORSE THAN THE UNIFORM-PARENT PLATEAU"),
    (-0.1, 0.2, "NO PROGRESS BEYOND ITS STANDARD ERROR (progress -0.100 +- 0.200"),  # below 0, not by 2 SE: was WORSE THAN THE PLATEAU
    (0.3, 0.05, "LEAVING THE PLATEAU (progress 0.300 +- 0.050"),
])  # fmt: skip
def test_where_a_model_stands_is_said_only_as_far_as_its_standard_error_allows(progress, se, words):
    text = inspect.circuit_text(_verdict(progress, se))
    assert text.startswith(words), text


def test_the_circuit_link_is_a_path_only_where_the_file_is(tmp_path, monkeypatch):
    """From the clone, the committed circuit by its path under the current folder; from another folder,
    absolute (before: 'figures/circuit.json', relative to the clone); for a model whose circuit is not
    computed, no path (before: 'runs/figures/.../circuit.json', a file that did not exist) but the command."""
    committed = json.loads((common.FIGURES_DIR / "circuit.json").read_text())
    digest = committed["checkpoint_hash"]
    monkeypatch.chdir(common.FIGURES_DIR.parent)
    assert inspect.circuit_link("standard", digest)["json"] == "figures/circuit.json"
    monkeypatch.chdir(tmp_path)
    link = inspect.circuit_link("standard", digest)
    assert Path(link["json"]).is_absolute() and Path(link["json"]).is_file()
    assert inspect.link_words(link).startswith(f"the discovered circuit (the edges between these heads): {link['json']}")
    missing = inspect.circuit_link("standard", "another")
    assert missing["json"] is None and not (tmp_path / "runs").exists()
    words = inspect.link_words(missing)
    assert "circuit.json" not in words and "python -m analyses.circuit --checkpoint standard writes it" in words
    written = tmp_path / common.default_out("standard") / "circuit.json"  # once analyses.circuit has run here
    written.parent.mkdir(parents=True)
    written.write_text("{}")
    assert inspect.circuit_link("standard", "another")["json"] == str(common.default_out("standard") / "circuit.json")
