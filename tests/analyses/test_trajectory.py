"""analyses.trajectory: phases found on synthetic curves whose switch is known by construction, every
per-snapshot number equal to the one computed from that snapshot loaded directly, a real run end to end
(both trainers' snapshots), and a run without snapshots refused with one line."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from conftest import tiny_train_config

import models
from analyses import trajectory as tj
from models.training.standard import StandardConfig, train_standard
from models.training.train import train
from probes import bma_posterior, bma_predictive, head_assignment, mean_tv, target_nll


# Phases on synthetic curves ---------------------------------------------------------------------------
def two_strategy_curves(cross: float, steps: list[int]):
    """KL from A rises and KL from B falls linearly, crossing at ``cross``; the loss drops by a sigmoid there."""
    s = np.array(steps, float)
    kl = {"A": list(0.1 + 0.001 * s), "B": list(0.1 + 0.001 * cross + 0.002 * (cross - s))}
    loss = list(1.0 + 0.5 / (1 + np.exp((s - cross) / 10.0)) - 1e-5 * s)
    return kl, loss


def test_a_known_switch_is_found_where_the_curves_cross_and_is_sharp():
    steps = list(range(0, 1001, 50))
    kl, loss = two_strategy_curves(420.0, steps)
    r = tj.phases(steps, kl, loss)
    assert r["order"] == ["A", "B"]
    assert r["phases"] == [
        {"strategy": "A", "start": 0, "end": 400, "snapshots": 9},
        {"strategy": "B", "start": 450, "end": 1000, "snapshots": 12},
    ]
    (sw,) = r["switches"]
    assert (sw["from"], sw["to"], sw["step"], sw["after_step"]) == ("A", "B", 450, 400)
    assert sw["crossing"] == pytest.approx(420.0, abs=1e-9)  # linear curves: the interpolation is exact
    assert sw["sharp"] and sw["sharpness"] > 100


def test_a_switch_without_a_loss_drop_is_not_sharp_and_three_phases_keep_their_order():
    steps = list(range(0, 901, 50))
    s = np.array(steps, float)
    kl = {
        "uniform": list(np.abs(s - 0) / 100),
        "unigram": list(np.abs(s - 400) / 100),
        "bigram": list(np.abs(s - 800) / 100),
    }
    loss = list(2.0 - 1e-3 * s)  # falls at one rate throughout
    r = tj.phases(steps, kl, loss)
    assert r["order"] == ["uniform", "unigram", "bigram"]
    assert [sw["crossing"] for sw in r["switches"]] == pytest.approx([200.0, 600.0])
    assert [sw["step"] for sw in r["switches"]] == [250, 650]  # ties go to the first-listed strategy
    assert not any(sw["sharp"] for sw in r["switches"])
    assert all(sw["sharpness"] == pytest.approx(1.0) for sw in r["switches"])


def test_a_one_snapshot_flicker_is_merged_only_when_asked():
    steps = list(range(10))
    kl = {"A": [0, 0, 0, 0, 2, 0, 0, 2, 2, 2], "B": [1] * 10}
    loss = [1.0] * 10
    assert tj.phases(steps, kl, loss)["order"] == ["A", "B", "A", "B"]
    merged = tj.phases(steps, kl, loss, min_phase=2)
    assert merged["order"] == ["A", "B"]
    assert merged["phases"][1] == {"strategy": "B", "start": 7, "end": 9, "snapshots": 3}
    with pytest.raises(ValueError, match="one KL per strategy"):
        tj.phases(steps, {"A": [0.0]}, loss)


def test_identical_strategies_are_merged_under_one_name():
    a = torch.randn(2, 3, 4).log_softmax(-1)
    merged = tj.merge_identical({"bigram": a, "bayes": a.clone(), "uniform": torch.full_like(a, -math.log(4))})
    assert list(merged) == ["bigram=bayes", "uniform"]


# A real run ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 16-step run with a snapshot every 4 steps, and its trajectory as the CLI writes it."""
    tmp = tmp_path_factory.mktemp("trajectory")
    # a sharp kernel and 3 demonstrations: worth a clear gap between the plateau and Bayes on 64 contexts
    cfg = tiny_train_config(
        tmp, n_examples=3, seq_len=5, alpha=0.2, gamma=0.05, steps=16, snapshot_every=4, eval_every=8
    )
    train(cfg, progress=False)
    out = tmp / "figs"
    tj.main(["--checkpoint", str(tmp / "run"), "--out", str(out), "--n-contexts", "64", "--seed", "3"])
    return tmp / "run", json.loads((out / "trajectory.json").read_text())["results"], out


def test_the_cli_writes_the_set_with_every_snapshot_and_its_phases(run):
    folder, r, out = run
    assert [s["step"] for s in r["snapshots"]] == [4, 8, 12, 16]
    assert {p.name for p in out.iterdir()} >= {"trajectory.json", "trajectory_loss.png", "trajectory_circuit.pdf"}
    assert len(r["closest"]) == 4 and set(r["closest"]) <= set(r["strategies"])
    assert [p["strategy"] for p in r["phases"]] == r["order"] and len(r["switches"]) == len(r["phases"]) - 1


def test_every_per_snapshot_number_equals_the_snapshot_measured_directly(run):
    folder, r, _ = run
    task = models.load_task(folder)
    tokens, parents = task.sample(64, torch.Generator().manual_seed(3))
    L, H = task.n_examples, task.seq_len
    bayes = bma_predictive(task.pi, tokens, L, H, task.root, log=True)
    plateau = bma_predictive(task.pi, tokens, L, H, task.root, demonstrations=[], log=True)
    assert r["strategies"]["bayes"] == pytest.approx(target_nll(bayes, tokens), abs=1e-12)
    for row in r["snapshots"]:
        model = models.load(folder / "snapshots" / f"step_{row['step']:06d}")
        with torch.no_grad():
            lp = model(tokens).double()
            _, cache = model.run_with_cache(tokens)
        nll = -lp.gather(-1, tokens[:, -H:].unsqueeze(-1))[:, 1:].mean().item()
        assert row["nll"] == pytest.approx(nll, abs=1e-10)
        for name, ref in (("bayes", bayes), ("uniform-parent", plateau)):
            kl = (ref.exp() * (ref - lp)).sum(-1)[:, 1:].mean().item()  # KL(strategy || model)
            assert row["kl"][name] == pytest.approx(kl, abs=1e-10)
        gap = target_nll(plateau, tokens) - target_nll(bayes, tokens)
        assert gap > 0.05
        assert row["progress"] == pytest.approx((target_nll(plateau, tokens) - nll) / gap, abs=1e-9)
        demos, purity = head_assignment(model.copyer_pattern().detach(), L)
        assert row["copyer_purity"] == pytest.approx(sum(purity) / len(purity), abs=1e-6)
        assert row["distinct_demonstrations"] == len(set(demos))
        selector = cache["blocks.1.attn.hook_pattern"][:, 0].double()  # [batch, H, H], row 0 zero
        assert row["layers"][1]["tv"][0] == pytest.approx(
            mean_tv(selector, bma_posterior(task.pi, tokens, L, H)), abs=1e-6
        )
        # the selector reads only the target: all of its target-query mass is within the sequence
        assert row["layers"][1]["within_sequence"][0] == pytest.approx(
            selector[:, 1:].sum(-1).mean().item() * (H - 1) / H, abs=1e-6
        )


def test_snapshots_of_models_standard_are_read_end_to_end(tmp_path):
    cfg = StandardConfig(d_vocab=3, n_examples=2, seq_len=3, n_heads=2, d_model=8, d_mlp=16, steps=6, batch_size=8,
                         eval_every=3, eval_contexts=16, snapshot_every=3, out=str(tmp_path / "std"))  # fmt: skip
    train_standard(cfg, progress=False)
    assert sorted(p.name for p in (tmp_path / "std" / "snapshots").iterdir()) == ["step_000003", "step_000006"]
    final = models.load(tmp_path / "std")
    last = models.load(tmp_path / "std" / "snapshots" / "step_000006")
    for a, b in zip(final.parameters(), last.parameters()):
        assert torch.equal(a, b)  # the last snapshot is the final model
    tj.main(["--checkpoint", str(tmp_path / "std"), "--out", str(tmp_path / "figs"), "--n-contexts", "16"])
    r = json.loads((tmp_path / "figs" / "trajectory.json").read_text())["results"]
    assert r["family"] == "standard" and [s["step"] for s in r["snapshots"]] == [3, 6]
    assert len(r["snapshots"][0]["layers"]) == 2 and len(r["snapshots"][0]["layers"][0]["within_sequence"]) == 2


def test_a_run_without_snapshots_is_one_line_and_exit_2(tmp_path, capsys):
    train(tiny_train_config(tmp_path, steps=2, eval_every=2), progress=False)
    with pytest.raises(SystemExit) as e:
        tj.main(["--checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "figs")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no snapshots/ folder" in err[0] and "--snapshot-every" in err[0]
    assert not (tmp_path / "figs").exists()


def test_train_steps_trains_and_reads_a_short_run_of_the_shipped_config(tmp_path):
    tj.main(["--train-steps", "8", "--snapshot-every", "4", "--n-contexts", "16", "--out", str(tmp_path / "figs")])
    r = json.loads((tmp_path / "figs" / "trajectory.json").read_text())["results"]
    assert [s["step"] for s in r["snapshots"]] == [4, 8] and r["plateau"] == "uniform-parent"


def test_a_run_started_afresh_with_overwrite_replaces_the_old_runs_snapshots(tmp_path):
    """Snapshots of a longer earlier run must not mix into the new run's trajectory (both trainers)."""
    long = tiny_train_config(tmp_path, n_examples=2, seq_len=4, steps=12, snapshot_every=4, eval_every=12)
    train(long, progress=False)
    names = lambda folder: sorted(p.name for p in (folder / "snapshots").iterdir())  # noqa: E731
    assert names(tmp_path / "run") == ["step_000004", "step_000008", "step_000012"]
    train(dataclasses.replace(long, steps=6, snapshot_every=3, eval_every=6, overwrite=True), progress=False)
    assert names(tmp_path / "run") == ["step_000003", "step_000006"]

    std = StandardConfig(d_vocab=3, n_examples=2, seq_len=3, n_heads=2, d_model=8, d_mlp=16, steps=6, batch_size=8,
                         eval_every=6, eval_contexts=16, snapshot_every=2, out=str(tmp_path / "std"))  # fmt: skip
    train_standard(std, progress=False)
    assert names(tmp_path / "std") == ["step_000002", "step_000004", "step_000006"]
    train_standard(dataclasses.replace(std, steps=3, snapshot_every=3, eval_every=3), progress=False, overwrite=True)
    assert names(tmp_path / "std") == ["step_000003"]
