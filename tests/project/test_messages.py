"""What a new user meets first: output folders made the same way by every entry point, a folder that holds
a weight file answered with the file to pass, one error prefix (Ctrl-C included), and progress bars that
stay off stdout and out of logs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_cli_bad_input import TINY
from test_entry_point_convention import STANDARD
from test_formats_pipelines import LAYOUTS, small_task, tl_cfg_dict, tl_state, write_nanogpt, write_task

import models
from analyses import common, copyers
from models.plumbing.io import run_cli
from models.training import evaluate, standard, train

ROOT = Path(__file__).resolve().parents[2]


def test_every_entry_point_makes_the_missing_parents_of_out_and_json(tmp_path):
    standard.main([*STANDARD, "--out", str(tmp_path / "s" / "t" / "gpt")])
    assert (tmp_path / "s" / "t" / "gpt" / "task.json").is_file()
    train.main([*TINY, "--steps", "2", "--eval-every", "2", "--out", str(tmp_path / "r" / "u" / "run")])
    assert (tmp_path / "r" / "u" / "run" / "config.json").is_file()
    run_cli(evaluate.main, ["--n-contexts", "8", "--json", str(tmp_path / "e" / "v" / "m.json")])
    assert json.loads((tmp_path / "e" / "v" / "m.json").read_text())["n_contexts"] == 8
    copyers.main(["--out", str(tmp_path / "c" / "w" / "figs")])
    assert (tmp_path / "c" / "w" / "figs" / "copyers.json").is_file()


def test_a_nanogpt_output_folder_loads_its_ckpt_pt(tmp_path):
    """nanoGPT's ``out/`` holds one weight file, ``ckpt.pt``: the folder is read as that file (issue 45)."""
    ckpt, _, _ = write_nanogpt(tmp_path / "out", small_task(), LAYOUTS["special"])
    folder, file = models.load_subject(tmp_path / "out"), models.load_subject(ckpt)
    assert folder.hash == file.hash and folder.n_heads == file.n_heads
    tokens, _ = file.task.sample(4, torch.Generator().manual_seed(0))
    assert torch.equal(folder.log_probs(tokens), file.log_probs(tokens))


def test_a_folder_with_two_weight_files_names_them(tmp_path):
    task = small_task()
    cfg = tl_cfg_dict()
    torch.save(tl_state(cfg, with_ln=True), tmp_path / "w.pt")
    torch.save(tl_state(cfg, with_ln=True), tmp_path / "v.pt")
    (tmp_path / "config.json").write_text(json.dumps(cfg))  # cfg.to_dict(), as TransformerLens users save it
    write_task(tmp_path, task, LAYOUTS["special"])
    with pytest.raises(ValueError) as e:
        models.load(tmp_path)
    assert f"pass the file itself, --checkpoint {str(tmp_path / 'v.pt')!r}" in str(e.value)
    # without a task.json, read as one of our folders: the same line
    (tmp_path / "task.json").unlink()
    (tmp_path / "config.json").unlink()
    with pytest.raises(ValueError, match="holds the weight file 'v.pt' \\(or w.pt\\)"):
        models.load(tmp_path)
    # with one weight file and its TransformerLens config beside it, the folder is read as that file
    (tmp_path / "v.pt").unlink()
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    write_task(tmp_path, task, LAYOUTS["special"])
    assert models.load_subject(tmp_path).hash == models.load_subject(tmp_path / "w.pt").hash


def test_ctrl_c_in_an_analysis_is_one_line_with_the_entry_points_prefix(monkeypatch, tmp_path, capsys):
    def interrupted(subject, args):
        raise KeyboardInterrupt

    monkeypatch.setattr(copyers.ANALYSIS, "compute", interrupted)
    with pytest.raises(SystemExit) as e:
        common.run_cli(copyers.main, ["--out", str(tmp_path / "o")])
    assert e.value.code == 130
    assert capsys.readouterr().err.splitlines() == ["python -m analyses.copyers: error: interrupted"]
    assert not (tmp_path / "o").exists()


def test_the_summary_is_alone_on_stdout_and_a_log_gets_plain_progress_lines(tmp_path):
    """Piped (as into a log file), stdout holds the summary and the last line; stderr holds no progress
    bar (tqdm draws one only on a terminal) and so no line of spaces, but plain progress lines (here every
    0.05 s instead of 30 s: ``models.plumbing.progress``), each saying the stage and the time elapsed. Which
    stages are named depends on how long each lasts on this machine (the compute of 32 contexts can take less
    than the interval); loading and saving take longer, and the stages named come in the run's order."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "CAUSAL_ICL_PROGRESS_S": "0.05"}
    run = subprocess.run(
        [sys.executable, "-m", "analyses.head_ablation", "--n-contexts", "32", "--out", str(tmp_path / "o")],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-500:]
    lines = run.stdout.splitlines()
    assert lines[0].startswith("intact: NLL") and lines[-1].startswith("wrote 5 files to ")
    assert all(line.strip() for line in lines) and "\r" not in run.stdout
    log = run.stderr.splitlines()
    assert log and "\r" not in run.stderr and all(re.match(r"^(analyses\.head_ablation|ablations): .*elapsed", x) for x in log), log
    named = [m.group(1) for x in log if (m := re.search(r"\(stage=(\w+)\)$", x))]
    order = ["load", "compute", "figures", "save"]
    assert {"load", "save"} <= set(named) and named == sorted(named, key=order.index), named
