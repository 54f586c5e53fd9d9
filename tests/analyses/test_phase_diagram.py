"""analyses.phase_diagram: the sweep on a tiny grid runs for every family, its progress is the hand
computation from NLLs recomputed here (BMA and the plateau by brute force), boundary cells get seeds; a
re-plot reads a trained sweep back unchanged; the committed figure re-plots the committed full sweep,
whose numbers are checked the same way."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from analyses import phase_diagram
from analyses.phase_diagram import QUICK, Grid, plot, plot_curves, steps_to, train_grid
from models.training.standard import StandardConfig

ROOT = Path(__file__).resolve().parents[2]


def _brute_force_nlls(task, tokens) -> tuple[float, float]:
    """NLL (h >= 1) of BMA and of the uniform-parent plateau, looping over contexts and parents."""
    pi, L, H = task.pi.numpy(), task.n_examples, task.seq_len
    x = tokens.numpy().reshape(len(tokens), L + 1, H)
    bma, flat = [], []
    for b in range(len(x)):
        for h in range(1, H):
            like = np.array([np.prod([pi[x[b, l, j], x[b, l, h]] for l in range(L)]) for j in range(h)])
            cand = np.array([pi[x[b, L, j], x[b, L, h]] for j in range(h)])
            bma.append(-np.log(like @ cand / like.sum()))
            flat.append(-np.log(cand.mean()))
    return float(np.mean(bma)), float(np.mean(flat))


TINY = dataclasses.replace(  # the quick grid (one extra seed, one boundary cell), smaller still
    QUICK,
    kernels=[(0.3, 0.05)],
    rows=[(2, "target")],
    steps=4,
    disentangled_steps=4,
    eval_every=2,
    eval_contexts=24,
    seq_len=4,
    boundary=10.0,  # every cell is "near the boundary": the extra seeds run
    d_model=8,
    n_heads=2,
    d_mlp=8,
    batch_size=8,
)


@pytest.fixture(scope="module")
def tiny():
    return train_grid(TINY, log=lambda s: None)


def check_progress(res: dict, eval_contexts: int) -> None:
    """Every run's reference NLLs against the brute force on the same held-out contexts, its progress
    against the hand computation from its NLLs, every cell's summary against its runs."""
    grid = res["grid"]
    for c in res["cells"]:
        task = StandardConfig(
            d_vocab=grid["d_vocab"], n_examples=c["L"], seq_len=grid["seq_len"], alpha=c["alpha"], gamma=c["gamma"],
            task_seed=grid["task_seed"],
        ).task()  # fmt: skip
        for r in c["runs"]:
            tokens, _ = task.sample(eval_contexts, torch.Generator().manual_seed(r["seed"] + 1_000_003))
            nll_bma, nll_flat = _brute_force_nlls(task, tokens)
            assert abs(r["nll_bma"] - nll_bma) < 1e-9 and abs(r["nll_uniform"] - nll_flat) < 1e-9
            want = [(r["nll_uniform"] - n) / (r["nll_uniform"] - r["nll_bma"]) for n in r["nll"]]
            assert np.allclose(r["progress"], want, rtol=0, atol=1e-12)
        assert c["final_progress"] == [r["progress"][-1] for r in c["runs"]]
        assert c["mean_progress"] == np.mean(c["final_progress"])
        assert c["steps_to_half"] == [steps_to(r) for r in c["runs"]]


def test_tiny_sweep_progress_matches_a_hand_computation(tiny):
    res = tiny
    cells = res["cells"]
    assert [c["family"] for c in cells] == ["gpt2", "attn_only", "disentangled"]
    check_progress(res, eval_contexts=24)
    assert all(r["steps"] == [0, 2, 4] for c in cells for r in c["runs"])
    assert [c["seeds"] for c in cells] == [[0, 1]] * 3  # every cell is a boundary cell here
    plot(res)
    plot_curves(res)


def test_a_replot_reads_a_trained_sweep_back_unchanged(tiny, tmp_path):
    trained = {"command": "python -m analyses.phase_diagram --quick", "results": {**tiny, "mode": "quick"}}
    (tmp_path / "sweep.json").write_text(json.dumps(trained))
    phase_diagram.main(["--sweep", str(tmp_path / "sweep.json"), "--out", str(tmp_path / "out")])
    replot = json.loads((tmp_path / "out" / "phase_diagram.json").read_text())
    assert replot["results"]["cells"] == json.loads(json.dumps(tiny["cells"]))
    assert replot["results"]["sweep"] == {"file": str(tmp_path / "sweep.json"), "command": trained["command"]}
    assert {p.name for p in (tmp_path / "out").iterdir()} >= {"phase_diagram.png", "phase_diagram_curves.pdf"}


@pytest.mark.parametrize(
    "results, message",
    [
        (None, "holds no trained sweep"),
        ({"grid": {}, "seed": 0, "cells": [], "seconds": 1, "mode": "rerun"}, "holds no trained sweep"),
        ({"grid": {"kernels": 3}, "seed": 0, "cells": [], "seconds": 1, "mode": "full"}, "grid or cells are malformed"),
        ("drop one cell", "lacks 1 cells of its grid"),
    ],
)
def test_a_sweep_file_that_cannot_be_replotted_is_one_line(tiny, results, message, tmp_path, capsys):
    if results == "drop one cell":
        results = {**json.loads(json.dumps(tiny)), "mode": "quick"}
        results["cells"] = results["cells"][1:]
    (tmp_path / "sweep.json").write_text(json.dumps({"command": "x", "results": results}))
    with pytest.raises(SystemExit) as e:
        phase_diagram.common.run_cli(phase_diagram.main, ["--sweep", str(tmp_path / "sweep.json"), "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_a_replot_does_not_write_over_its_own_sweep(tmp_path, capsys):
    (tmp_path / "phase_diagram.json").write_text("{}")
    with pytest.raises(SystemExit) as e:
        phase_diagram.main(["--sweep", str(tmp_path / "phase_diagram.json"), "--out", str(tmp_path)])
    assert e.value.code == 2 and "is the file this run writes" in capsys.readouterr().err


def test_the_committed_figure_replots_the_committed_full_sweep():
    """figures/phase_diagram_sweep.json is a --full run of today's grid (every cell, its numbers checked
    against the brute force), and figures/phase_diagram.json plots exactly its cells."""
    sweep = phase_diagram.read_sweep(phase_diagram.SWEEP)
    assert sweep["mode"] == "full" and sweep["grid"] == json.loads(json.dumps(dataclasses.asdict(Grid())))
    assert len(sweep["cells"]) == len(phase_diagram.cells_of(Grid())) == 44
    assert sweep["sweep"]["command"].startswith("python -m analyses.phase_diagram --full")
    check_progress(sweep, eval_contexts=Grid().eval_contexts)
    figure = json.loads((ROOT / "figures" / "phase_diagram.json").read_text())["results"]
    assert figure["cells"] == sweep["cells"] and figure["sweep"]["file"] == "figures/phase_diagram_sweep.json"


def test_steps_to_half_is_the_first_evaluation_at_or_above_it():
    run = {"steps": [0, 100, 200, 300], "progress": [-0.1, 0.49, 0.5, 0.9]}
    assert steps_to(run) == 200 and steps_to(run, 0.95) is None


def test_bad_grid_is_one_line_error():
    with pytest.raises(ValueError, match="families must be among"):
        Grid(families=["lstm"])
    with pytest.raises(ValueError, match="rows must be"):
        Grid(rows=[(6, "some")])
    assert phase_diagram.QUICK.steps < Grid().steps
