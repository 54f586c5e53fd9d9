"""analyses.inspect: credits the parent-selecting head of a working model, reports plateau models as such."""

from __future__ import annotations

import json

import numpy as np
import torch
from conftest import build_task
from test_formats import file_config, hf_folder

import models
from analyses import inspect
from analyses.inspect import Heads, inspect_model, query_rows


def test_theorem1_model_is_credited_with_its_parent_head_and_copyers():
    task = build_task(n_examples=4, seq_len=6)
    model = models.theorem1_model(task.pi, 4, 6, beta=50)
    r = inspect_model(model, task, n_contexts=256, seed=0)
    assert r["progress"] > 0.99 and not r["on_plateau"]
    assert r["parent_selecting"] == ["L1H0"]
    assert r["copyers"] == {f"L0H{k}": k for k in range(4)}  # Theorem 1: head k copies demonstration k
    head = r["heads"][-1]
    assert head["tv"] < 1e-6 and abs(head["parent_acc"] - r["acc_bma"]) < 1e-12


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
    r = inspect_model(_plateau_model(task, False), task, n_contexts=128, seed=1)
    # Independent computation of the plateau NLL: mean over h' < h of pi(. | x_h'), in NumPy.
    tokens, _ = task.sample(128, torch.Generator().manual_seed(1))
    pi, t = task.pi.numpy(), tokens[:, -6:].numpy()
    nll = -np.mean([np.log(pi[t[b, :h], t[b, h]].mean()) for b in range(128) for h in range(1, 6)])
    assert abs(r["nll"] - nll) < 1e-9 and abs(r["nll_uniform"] - nll) < 1e-9
    assert r["on_plateau"] and r["parent_selecting"] == []


def test_plateau_models_get_no_credit_even_when_a_head_scores_best_among_bad_ones():
    task = build_task(n_examples=4, seq_len=6)
    noisy = inspect_model(_plateau_model(task, False, noise=0.3), task, n_contexts=128, seed=2)
    assert noisy["on_plateau"] and noisy["parent_selecting"] == [] and noisy["best_head"]
    # A head whose attention is exactly BMA's, in a model whose output ignores it: still no credit.
    deaf = inspect_model(_plateau_model(task, True), task, n_contexts=128, seed=2)
    assert deaf["heads"][-1]["tv"] < 1e-6
    assert deaf["progress"] < 0 and deaf["on_plateau"] and deaf["parent_selecting"] == []


def test_standard_model_candidate_attention_matches_hugging_face(tmp_path):
    from transformers import GPT2LMHeadModel

    folder, _, task = hf_folder(tmp_path, build_task(n_examples=4, seq_len=6, alpha=0.3))
    bridge = models.load(folder)
    hf = GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()
    tokens, _ = task.sample(4, torch.Generator().manual_seed(3))
    rows = query_rows(bridge, Heads.of(bridge), tokens, task)
    att = hf(tokens, output_attentions=True).attentions  # [batch, head, query, key] per layer
    L, H = task.n_examples, task.seq_len
    for layer in range(2):
        for h in range(H):
            want = att[layer][:, :, L * H + h - 1]
            assert torch.allclose(rows[layer][:, :, h].float(), want, atol=1e-5)
    r = inspect_model(bridge, task, n_contexts=128, seed=0)  # untrained
    assert r["nll_uniform"] - r["nll_bma"] > 0.02  # demonstrations matter on this task
    assert r["kind"] == "standard" and len(r["heads"]) == 4 and r["on_plateau"] and not r["parent_selecting"]


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
    )
    assert r["parent_selecting"] == ["L1H0"]
    saved = json.loads((tmp_path / "out" / "inspect.json").read_text())
    assert saved["results"]["progress"] == r["progress"] and saved["checkpoint_hash"]
    assert (tmp_path / "out" / "inspect_heads.png").is_file()
    assert "parent-selecting heads: L1H0" in capsys.readouterr().out
