"""analyses.inspect_standard: analyses.inspect's report under its own names, on --checkpoint standard by
default, with the same numbers as analyses.inspect on the same model."""

from __future__ import annotations

import json

import torch
from conftest import build_task
from test_formats import file_config

import models
from analyses import common, inspect, inspect_standard


def test_the_default_checkpoint_is_the_standard_gpt2():
    args = common.parser_for(inspect_standard.ANALYSIS).parse_args([])
    assert args.checkpoint == "standard" and args.n_contexts == inspect.Config().n_contexts


def test_same_numbers_as_inspect_under_its_own_file_names(tmp_path):
    task = build_task(n_examples=4, seq_len=6, alpha=0.3)
    model = models.theorem1_model(task.pi, 4, 6, beta=50)
    torch.save(model.state_dict(), tmp_path / "w.pt")
    (tmp_path / "cfg.json").write_text(json.dumps(file_config(model, task)))
    argv = ["--checkpoint", str(tmp_path / "w.pt"), "--config", str(tmp_path / "cfg.json"), "--n-contexts", "64"]
    inspect.main([*argv, "--out", str(tmp_path / "a")])
    inspect_standard.main([*argv, "--out", str(tmp_path / "b")])
    written = sorted(p.name for p in (tmp_path / "b").iterdir())
    expected = sorted([*inspect_standard.FIGURES, *(f.replace(".png", ".pdf") for f in inspect_standard.FIGURES)])
    assert written == sorted([*expected, "inspect_standard.json"])
    assert all(name.startswith("inspect_standard_") for name in inspect_standard.FIGURES)
    a = json.loads((tmp_path / "a" / "inspect.json").read_text())
    b = json.loads((tmp_path / "b" / "inspect_standard.json").read_text())
    assert a["results"] == b["results"] and a["checkpoint_hash"] == b["checkpoint_hash"]
