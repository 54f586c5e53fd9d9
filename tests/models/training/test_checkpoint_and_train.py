"""Checkpoints (round trip, atomicity, bad input), training determinism, and the shipped checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys

import forked
import numpy as np
import pytest
import safetensors.torch
import torch
from test_model import random_model

import models
from models import CausalTransformer, CausalTransformerConfig, load_task
from models.training.train import train
from probes import MarkovTreeTask, bma_posterior, bma_predictive, head_assignment, mean_tv, target_nll
from tests.conftest import build_task, tiny_train_config


def test_save_load_round_trip_is_exact(tmp_path):
    model = random_model(dtype="float32")
    task = build_task()
    models.save(model, tmp_path / "ckpt", task=task, training={"note": "test"})
    loaded = models.load(tmp_path / "ckpt")
    a, b = model.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    tokens, _ = task.sample(8)
    assert torch.equal(model(tokens), loaded(tokens))
    assert torch.equal(load_task(tmp_path / "ckpt").pi, task.pi)
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert {"model", "task", "training", "versions"} <= set(config)


def test_a_crash_while_saving_leaves_the_previous_checkpoint_intact(tmp_path, monkeypatch):
    path = tmp_path / "ckpt"
    first = random_model(seed=1, dtype="float32")
    models.save(first, path, task=build_task())
    before = {f.name: f.read_bytes() for f in path.iterdir()}

    def crash(*args, **kwargs):
        (args[1].parent / "model.safetensors").write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", crash)
    with pytest.raises(OSError, match="disk full"):
        models.save(random_model(seed=2, dtype="float32"), path, task=build_task())
    assert {f.name: f.read_bytes() for f in path.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"], "temporary folder left behind"
    assert torch.equal(models.load(path).W_KQ, first.W_KQ)


def test_save_refuses_to_replace_a_folder_that_is_not_a_checkpoint(tmp_path):
    (tmp_path / "notes.txt").write_text("precious")
    with pytest.raises(ValueError, match="not a checkpoint folder"):
        models.save(random_model(), tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "precious"


def _saved(tmp_path, model=None):
    path = tmp_path / "ckpt"
    models.save(model or random_model(dtype="float32"), path, task=build_task())
    return path


def test_missing_extra_and_misshapen_keys_are_listed_in_one_error(tmp_path):
    path = _saved(tmp_path)
    state = safetensors.torch.load_file(path / "model.safetensors")
    state.pop("b_root")
    state["extra.weight"] = torch.zeros(2)
    state["blocks.1.attn.W_OV"] = torch.zeros(3, 3)
    safetensors.torch.save_file(state, path / "model.safetensors")
    with pytest.raises(ValueError) as e:
        models.load(path)
    msg = str(e.value)
    assert "missing b_root (4,)" in msg and "unexpected extra.weight" in msg
    assert "blocks.1.attn.W_OV: got (3, 3), expected (16, 4)" in msg and "\n" not in msg


def test_config_that_disagrees_with_the_weights_is_rejected(tmp_path):
    path = _saved(tmp_path)
    config = json.loads((path / "config.json").read_text())
    config["model"]["d_vocab"] = 5
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="the task's d_vocab=4 disagrees with the model's d_vocab=5"):
        models.load(path)
    config["model"]["d_vocab"], config["model"]["n_copy_heads"] = 4, 2  # the task says nothing of K
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="wrong shape"):
        models.load(path)


def test_nan_weights_are_rejected(tmp_path):
    path = _saved(tmp_path)
    state = safetensors.torch.load_file(path / "model.safetensors")
    state["blocks.1.attn.W_KQ"][0, 0] = float("nan")
    safetensors.torch.save_file(state, path / "model.safetensors")
    with pytest.raises(ValueError, match="NaN or Inf values in blocks.1.attn.W_KQ"):
        models.load(path)


def test_folder_without_config_and_missing_folder(tmp_path):
    with pytest.raises(ValueError, match="has no config.json"):
        models.load(tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        models.load(tmp_path / "nowhere")


def test_truncated_weights_file_gives_a_clear_error(tmp_path):
    path = _saved(tmp_path)
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        models.load(path)


def test_training_is_deterministic_for_a_seed(tmp_path):
    a, _ = train(tiny_train_config(tmp_path / "a"), progress=False)
    b, _ = train(tiny_train_config(tmp_path / "b"), progress=False)
    c, _ = train(tiny_train_config(tmp_path / "c", seed=1), progress=False)
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k
    assert not torch.equal(a.W_KQ, c.W_KQ)
    config = json.loads((tmp_path / "a" / "run" / "config.json").read_text())
    assert config["training"]["config"]["seed"] == 0 and config["training"]["history"][-1]["step"] == 12


def test_train_cli_help_and_bad_values():
    ok = subprocess.run([sys.executable, "-m", "models.train", "--help"], capture_output=True, text=True)
    assert ok.returncode == 0 and "--n-examples" in ok.stdout and "--copyer-lr-scale" in ok.stdout
    bad = forked.run("models.train", "--steps", "0", cwd=forked.ROOT)
    assert bad.returncode == 2 and "steps must be >= 1" in bad.stderr and "Traceback" not in bad.stderr


def test_shipped_checkpoint_meets_the_training_targets_on_fresh_contexts():
    model = models.load(models.DEFAULT_CHECKPOINT)
    task = load_task(models.DEFAULT_CHECKPOINT)
    config = json.loads((models.DEFAULT_CHECKPOINT / "config.json").read_text())
    assert config["training"]["config"]["seed"] == 0 and "torch" in config["versions"]
    tokens, parents = task.sample(4096, torch.Generator().manual_seed(12345))  # not the training/eval seeds
    with torch.no_grad():
        log_probs, cache = model.run_with_cache(tokens, names_filter="blocks.1.attn.hook_pattern")
    bma = bma_predictive(task.pi, tokens, task.n_examples, task.seq_len, task.root, log=True)
    gap = target_nll(log_probs, tokens) - target_nll(bma, tokens)
    tv = mean_tv(
        cache["blocks.1.attn.hook_pattern"][:, 0], bma_posterior(task.pi, tokens, task.n_examples, task.seq_len)
    )
    demos, purity = head_assignment(model.copyer_pattern(), task.n_examples)
    assert gap <= 0.01, gap
    assert tv <= 0.05, tv
    assert min(purity) >= 0.9, purity
    assert len(set(demos)) == model.cfg.n_copy_heads == task.n_examples, demos


def test_task_round_trips_through_its_dict():
    pi = build_task().pi
    task = MarkovTreeTask(pi, 3, 5, root=torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64))
    again = MarkovTreeTask.from_dict(json.loads(json.dumps(task.to_dict())))
    assert torch.equal(again.pi, task.pi) and torch.equal(again.root, task.root)
    with pytest.raises(ValueError, match="d_vocab=9 disagrees"):
        MarkovTreeTask.from_dict({**task.to_dict(), "d_vocab": 9})


def test_model_with_more_heads_than_demonstrations_builds():
    model = CausalTransformer(CausalTransformerConfig(3, 2, 4, n_copy_heads=4))
    tokens, _ = build_task(d_vocab=3, n_examples=2, seq_len=4).sample(2)
    assert model(tokens).shape == (2, 4, 3)


def test_evaluate_cli_weights_chunks_by_size_and_rejects_bad_sizes(tmp_path, capsys):
    from models import load_subject
    from models.training.evaluate import evaluate, evaluate_subject, main

    subject = load_subject("default")
    got = evaluate_subject(subject, 500, seed=3, batch_size=300)  # chunks of 300 and 200
    g = torch.Generator().manual_seed(3)
    parts = [evaluate(subject.model, subject.task, *subject.task.sample(n, g)) for n in (300, 200)]
    for key in ("nll_gap", "tv_to_bma", "parent_acc", "parent_acc_bma"):
        assert got[key] == pytest.approx((300 * parts[0][key] + 200 * parts[1][key]) / 500, abs=1e-12)
    assert got["head_demo"] == parts[1]["head_demo"] and got["n_contexts"] == 500
    # The gap's standard error, independently: per-context NLLs by NumPy indexing, then std / sqrt(n) per chunk,
    # and the chunks' SEs pooled as the weighted mean's: sqrt(sum (n_i se_i)^2) / N.
    g, ses = torch.Generator().manual_seed(3), []
    for n in (300, 200):
        tokens, _ = subject.task.sample(n, g)
        t = subject.task
        bma = bma_predictive(t.pi, tokens, t.n_examples, t.seq_len, t.root, log=True)
        with torch.no_grad():
            lp = subject.model(tokens)
        target = tokens[:, -subject.task.seq_len :].numpy()
        rows, cols = np.arange(n)[:, None], np.arange(subject.task.seq_len)[None, :]
        gap = (bma.double().numpy()[rows, cols, target] - lp.double().numpy()[rows, cols, target])[:, 1:].mean(1)
        ses.append(gap.std(ddof=1) / np.sqrt(n))
        assert parts[len(ses) - 1]["nll_gap_se"] == pytest.approx(ses[-1], rel=1e-9)
    assert got["nll_gap_se"] == pytest.approx(np.hypot(300 * ses[0], 200 * ses[1]) / 500, rel=1e-9)
    out = tmp_path / "m.json"
    main(["--checkpoint", "default", "--n-contexts", "64", "--json", str(out)])
    assert json.loads(out.read_text())["n_contexts"] == 64
    bad_runs = (["--n-contexts", "0"], ["--batch-size", "-1"], ["--checkpoint", str(tmp_path / "missing")], ["x"])
    for bad in bad_runs:
        with pytest.raises(SystemExit) as e:
            main(bad)
        assert e.value.code == 2
