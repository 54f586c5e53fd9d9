"""analyses.standard_circuit on models whose circuit is known: the constructed transposed circuit (BMA
exactly, through within-sequence layer-0 heads and a cross-demonstration layer-1 head) and a tiny
Hugging Face GPT-2."""

from __future__ import annotations

import json
import re

import torch
import torch.nn.functional as F
from conftest import build_task
from constructed import transposed_subject
from test_formats import hf_folder

from analyses import standard_circuit as sc
from models.interp import path_patching as pp
from models.interp.interventions import head_outputs
from models.interp.subject import load_subject
from probes import bma_predictive, target_nll


def test_heads_of_the_transposed_circuit_are_found_and_carry_it():
    task = build_task(n_examples=4, seq_len=6, alpha=0.3)
    subject = transposed_subject(task)
    tokens, parents = task.sample(128, torch.Generator().manual_seed(0))
    groups = sc.head_groups(subject, tokens, parents)
    assert groups["within"] == [0, 1] and groups["readers"] == [0]
    bad = task.sample(128, torch.Generator().manual_seed(1))[0]
    bad[:, -6:] = tokens[:, -6:]
    r = sc.group_interventions(subject, tokens, bad, {"within": (0, [0]), "dummy": (1, [1]), "readers": (1, [0])})
    assert r["groups"]["within"]["ablation_dnll"] > 0.05 and r["groups"]["readers"]["ablation_dnll"] > 0.05
    assert r["groups"]["dummy"]["ablation_dnll"] == 0 and r["groups"]["dummy"]["patching_restored"] == 0
    assert abs(r["groups"]["readers"]["patching_restored"] - 1) < 1e-9


def test_dropping_a_demonstration_from_the_reader_gives_bma_without_it():
    task = build_task(n_examples=4, seq_len=6, alpha=0.3)
    subject = transposed_subject(task)
    tokens, _ = task.sample(64, torch.Generator().manual_seed(2))
    for l in range(4):
        keep = [k for k in range(4) if k != l]
        want = bma_predictive(task.pi, tokens, 4, 6, task.root, demonstrations=keep, log=True).double()
        got = subject.log_probs(tokens, pp.drop_demonstration_hook(subject, [0], l, renormalise=False))
        assert torch.allclose(got[:, 1:], want[:, 1:], atol=1e-9)
    r = pp.bma_without(subject, tokens, [0])
    assert abs(r["slope"] - 1) < 1e-6 and abs(r["correlation"] - 1) < 1e-6 and r["kl_without_vs_ablated"] < 1e-9
    assert r["kl_without_vs_clean"] > 0.01  # dropping a demonstration does change BMA
    other = pp.bma_without(subject, tokens, [1])  # a head the read-out ignores: nothing moves
    assert abs(other["kl_without_vs_clean"] - other["kl_without_vs_ablated"]) < 1e-12


def test_corrupting_a_demonstration_moves_the_model_as_it_moves_bma():
    task = build_task(n_examples=3, seq_len=5, alpha=0.3)
    subject = transposed_subject(task)
    tokens, _ = task.sample(64, torch.Generator().manual_seed(3))
    r = sc.demonstration_corruption(subject, tokens, seed=0)
    for kind in sc.KINDS:
        for m, b in zip(r[kind]["model"], r[kind]["bma"]):
            assert (m is None and b is None) or abs(m - b) < 1e-9
    # BMA's prediction of x_h reads demonstration tokens at h' <= h only; at h = 1 the parent is 0 for sure.
    assert all(v is None or abs(v) < 1e-12 for v in r["later"]["bma"])
    assert abs(r["earlier"]["bma"][0]) < 1e-12 and r["earlier"]["bma"][2] > 1e-3 and r["at_h"]["bma"][2] > 1e-3


def test_log_pi_read_out_is_exact_from_pair_features_and_additive_from_token_features():
    task = build_task(n_examples=3, seq_len=4, alpha=0.3)
    L, H, d = 3, 4, task.d_vocab
    tokens, _ = task.sample(400, torch.Generator().manual_seed(4))
    demos = tokens.view(-1, L + 1, H)[:, :L]
    onehot = F.one_hot(demos, d).double()  # [batch, L, H, d]
    pair = torch.einsum("nlja,nlhc->nlhjac", onehot, onehot).flatten(3)  # (x_j, x_h) for every j at (l, h)
    tok = onehot.flatten(2).unsqueeze(2).expand(-1, -1, H, -1)  # every token of the sequence, no products
    pairs = sc.logpi_readout(dict.fromkeys(sc.SITES, pair), tokens, task, seed=0)
    assert all(r2 > 0.999 for r2 in pairs["r2"].values())
    assert pairs["implied"]["correlation"] > 0.999 and pairs["implied"]["column_softmax_max_error"] < 1e-3
    additive = sc.logpi_readout(dict.fromkeys(sc.SITES, tok), tokens, task, seed=0)
    assert all(abs(r2 - additive["additive_r2"]) < 0.02 for r2 in additive["r2"].values())
    assert additive["additive_r2"] < 0.95  # log pi of this kernel is not a sum of functions of each token
    # A read-out that is additive in the tokens implies a matrix well short of log pi; pair features reach it.
    assert max(additive["implied"]["correlation"], additive["additive_implied"]["correlation"]) < 0.8
    probes = sc.pair_probes(dict.fromkeys(sc.SITES, pair), tokens, task, seed=0)
    acc = probes[sc.SITES[0]]["test_acc"]
    assert all(acc[h][j] == 1.0 for h in range(1, H) for j in range(h))


def test_sender_delta_is_what_the_head_adds_to_the_residual(tmp_path):
    folder, _, task = hf_folder(tmp_path, build_task(n_examples=3, seq_len=4, alpha=0.3))
    subject = load_subject(folder)
    tokens, _ = task.sample(8, torch.Generator().manual_seed(5))
    bad, _ = task.sample(8, torch.Generator().manual_seed(6))
    positions = subject.layout.token_positions()[:3].flatten()
    delta = pp.sender_delta(subject, tokens, bad, 1, positions)
    z_bad = head_outputs(subject, bad, [0])[0]
    store = {}

    def patch(z, hook):
        z = z.clone()
        z[:, positions, 1] = z_bad[:, positions, 1]
        return z

    def grab(key):
        return lambda x, hook: store.__setitem__(key, x.detach().clone())

    subject.log_probs(tokens, [("blocks.0.attn.hook_z", patch), ("blocks.0.hook_attn_out", grab("patched"))])
    subject.log_probs(tokens, [("blocks.0.hook_attn_out", grab("clean"))])
    assert torch.allclose(store["patched"] - store["clean"], delta, atol=1e-5)
    assert delta.abs().max() > 1e-3
    # A path from an unchanged context carries nothing, directly or through the MLP.
    clean = target_nll(subject.log_probs(tokens), tokens)
    for mlp in (False, True):
        assert abs(pp.path_patch(subject, tokens, tokens, [0, 1], [0, 1], positions, mlp) - clean) < 1e-6
    # All senders into all receivers through the MLP, with the receivers' queries clean: at the demonstration
    # positions every layer-1 input is then the corrupted run's wherever layer 0's heads differ.
    assert pp.path_patch(subject, tokens, bad, [0, 1], [0, 1], positions, True) != clean


def test_cli_writes_the_set_and_calls_an_untrained_model_a_plateau(tmp_path, capsys):
    folder, _, _ = hf_folder(tmp_path, build_task(n_examples=3, seq_len=4, alpha=0.3))
    r = sc.main(["--checkpoint", str(folder), "--n-contexts", "48", "--out", str(tmp_path / "out")]).data
    saved = json.loads((tmp_path / "out" / "standard_circuit.json").read_text())
    assert saved["results"]["conclusion"] == r["conclusion"]
    for stem in sc.FIGURES:
        for ext in ("png", "pdf"):
            assert (tmp_path / "out" / stem.replace(".png", f".{ext}")).is_file()
    out = capsys.readouterr().out
    assert r["progress"] < 0.5 and "plateau" in out
    # Each group member printed with its mass and its chance, the chance from its definition: the target query
    # predicting x_h (at position L H + h - 1; L H - 1 for h = 0) sees keys 0..q uniformly, and the reader's keys
    # are the demonstrations' L H tokens other than its own position.
    L, H = 3, 4
    per_h = [(L * H - 1) / (L * H)] + [L * H / (L * H + h) for h in range(1, H)]
    chance = sum(per_h) / H
    assert r["groups"]["readers"]
    for j in r["groups"]["readers"]:
        assert re.search(rf"L1H{j} [\d.]+ \(chance {chance:.2f}\)", out), (chance, out)
