"""The positions a model was trained on: a CatFormer (whose read-out is the last position's) and a GPT-2 trained
with ``--loss-on last`` are judged on the last token by default; inspect says which positions in its report and
JSON, and ``--positions`` chooses others. The NLLs are checked against the model's forward and the Bayes oracle
computed here, position by position."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import models
from analyses import inspect
from models.training.catformer import CatFormerTrainConfig, save_catformer, train_catformer
from models.training.standard import StandardConfig, train_standard
from probes import oracles

TASK = "nichani_dag:index=0:kernel=dirichlet"  # uniform roots: an exact Bayes oracle


@pytest.fixture(scope="module")
def catformer(tmp_path_factory):
    cfg = CatFormerTrainConfig(task_kind=TASK, steps=200, batch_size=64, eval_every=200, eval_contexts=64)
    model, history = train_catformer(cfg)
    folder = tmp_path_factory.mktemp("catformer") / "model"
    save_catformer(model, folder, cfg, history)
    return folder


def nll_rows(subject, tokens) -> np.ndarray:
    """-log p(x_h) of each target position, from the CatFormer's own forward (row h: position h - 1's read-out)."""
    with torch.no_grad():
        logits = subject.model(tokens[:, :-1]).double()  # [batch, T, d]: position p predicts token p + 1
    lp = logits.log_softmax(-1).numpy()
    x = tokens.numpy()
    return -np.take_along_axis(lp, x[:, 1:, None], -1)[..., 0]  # [batch, H - 1]: rows 1..H-1


def test_inspect_judges_a_catformer_on_the_last_token_and_says_so(catformer, capsys):
    subject = models.load_subject(catformer / "catformer.npz")
    assert subject.trained_on == "last"
    out = catformer.parent / "inspect"
    inspect.main(["--checkpoint", str(catformer / "catformer.npz"), "--n-contexts", "64", "--out", str(out)])
    assert "over the last token (the positions it was trained on)" in capsys.readouterr().out
    r = json.loads((out / "inspect.json").read_text())["results"]
    assert r["positions"] == "last" and r["trained_on"] == "last"
    tokens, _ = subject.task.sample(64, torch.Generator().manual_seed(0))  # inspect's contexts (--seed 0)
    rows = nll_rows(subject, tokens)
    bayes = oracles.bayes(subject.task, tokens)[0].numpy()
    bayes_last = -np.take_along_axis(bayes[:, -1], tokens.numpy()[:, -1:], -1).mean()
    assert r["nll"] == pytest.approx(rows[:, -1].mean(), abs=1e-6)
    assert r["nll_bma"] == pytest.approx(bayes_last, abs=1e-9)
    assert r["progress"] == pytest.approx((r["nll_uniform"] - r["nll"]) / (r["nll_uniform"] - r["nll_bma"]))
    inspect.main(["--checkpoint", str(catformer / "catformer.npz"), "--n-contexts", "64", "--positions", "all",
                  "--out", str(out)])  # fmt: skip
    assert "chosen with --positions" in capsys.readouterr().out
    r = json.loads((out / "inspect.json").read_text())["results"]
    assert r["positions"] == "all" and r["nll"] == pytest.approx(rows.mean(), abs=1e-6)


def test_their_own_catformer_file_without_a_record_is_trained_on_the_last_token(catformer, tmp_path):
    """Nichani et al.'s export (np.savez of the leaves) has no training record: the format says it."""
    (tmp_path / "catformer.npz").write_bytes((catformer / "catformer.npz").read_bytes())
    (tmp_path / "task.json").write_bytes((catformer / "task.json").read_bytes())
    assert models.load_subject(tmp_path / "catformer.npz").trained_on == "last"


@pytest.mark.parametrize("loss_on, trained_on", [("last", "last"), ("all", "all"), ("target", "all")])
def test_the_standard_trainers_loss_on_is_read_back(tmp_path, loss_on, trained_on):
    cfg = StandardConfig(task_kind=TASK, d_vocab=3, n_examples=0, seq_len=21, alpha=0.1, n_layers=1, n_heads=1,
                         d_model=8, d_mlp=8, steps=1, batch_size=4, eval_every=1, eval_contexts=8, loss_on=loss_on,
                         out=str(tmp_path / "m"))  # fmt: skip
    train_standard(cfg, progress=False)
    assert json.loads((tmp_path / "m" / "training.json").read_text())["config"]["loss_on"] == loss_on
    assert models.load_subject(tmp_path / "m").trained_on == trained_on


def test_trajectory_of_a_last_token_run_reads_the_last_token(tmp_path):
    """analyses.trajectory averages NLL, KL and progress over the trained positions too."""
    from analyses import trajectory

    cfg = StandardConfig(task_kind=TASK, d_vocab=3, n_examples=0, seq_len=21, alpha=0.1, n_layers=1, n_heads=1,
                         d_model=8, d_mlp=8, steps=2, batch_size=4, eval_every=2, eval_contexts=8, loss_on="last",
                         snapshot_every=1, out=str(tmp_path / "run"))  # fmt: skip
    train_standard(cfg, progress=False)
    trajectory.main(["--checkpoint", str(tmp_path / "run"), "--n-contexts", "32", "--out", str(tmp_path / "t")])
    r = json.loads((tmp_path / "t" / "trajectory.json").read_text())["results"]
    assert r["positions"] == "last" and r["trained_on"] == "last"
    snap = models.load_subject(tmp_path / "run" / "snapshots" / "step_000002")
    tokens, _ = snap.task.sample(32, torch.Generator().manual_seed(0))
    with torch.no_grad():
        lp = snap.log_probs(tokens).numpy()
    last = -np.take_along_axis(lp[:, -1], tokens.numpy()[:, -1:], -1).mean()
    assert r["snapshots"][-1]["nll"] == pytest.approx(last, abs=1e-9)



def test_the_circuit_of_a_last_token_model_is_judged_on_the_last_token_and_records_it(tmp_path):
    """``discover`` with its default ``positions`` ("trained") reads a GPT-2 trained with ``--loss-on last`` at
    the last token: the search contexts' NLL equals the model's own logits' there (computed here with the
    next-token shift), and the result records the positions; ``positions="all"`` reads every target."""
    from models.interp.circuit import CircuitConfig, discover
    from models.interp.circuit.discovery import sample

    cfg = StandardConfig(task_kind=TASK, d_vocab=3, n_examples=0, seq_len=21, alpha=0.1, n_layers=1, n_heads=1,
                         d_model=8, d_mlp=8, steps=1, batch_size=4, eval_every=1, eval_contexts=8, loss_on="last",
                         out=str(tmp_path / "m"))  # fmt: skip
    train_standard(cfg, progress=False)
    subject = models.load_subject(tmp_path / "m")
    config = CircuitConfig(n_contexts=32, n_held_out=32, curve_points=1)
    tokens = sample(subject.task, 32, config.seed)
    with torch.no_grad():
        logits = subject.model(subject.layout.encode(tokens)).double()  # position p predicts token p + 1
    x = tokens.numpy()
    lp = logits[:, :, : subject.task.d_vocab].log_softmax(-1).numpy()  # the task's plain layout: ids 0..d-1
    rows = -np.take_along_axis(lp[:, :-1], x[:, 1:, None], -1)[..., 0]  # rows 1..H-1
    r = discover(subject, config)
    assert r.config.positions == "last" and r.to_dict()["positions"] == "last" and r.to_dict()["trained_on"] == "last"
    assert r.nll == pytest.approx(rows[:, -1].mean(), abs=1e-6)
    every = discover(subject, CircuitConfig(n_contexts=32, n_held_out=32, curve_points=1, positions="all"))
    assert every.to_dict()["positions"] == "all" and every.nll == pytest.approx(rows.mean(), abs=1e-6)
