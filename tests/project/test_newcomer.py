"""What a new user meets first: the README's two commands are what CI runs, the pins cover every dependency,
an analysis of any checkpoint writes under a folder named for it (never over the committed figures), and a
Hugging Face folder without task.json is named as such."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from importlib.metadata import requires
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement

from analyses import common, copyers
from models.interp.subject import load_subject

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    """The first ```bash block of README.md, as .ci/run reads it (its own awk line)."""
    awk = re.search(r"commands=\$\(awk '(.*)' README.md\)", (ROOT / ".ci" / "run").read_text())[1]
    run = subprocess.run(["awk", awk, "README.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    return run.stdout.splitlines()


def test_ci_runs_the_readmes_two_commands_in_a_fresh_venv():
    first, second = readme_commands()
    setup = 'pip install torch==2.13.0 --extra-index-url https://download.pytorch.org/whl/cpu --retries 0 && pip install -e ".[dev]" -c constraints.txt && '
    assert first == setup + "python -m analyses.head_ablation"
    assert second == setup + "python -m pytest"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 -m venv" in ci and '. "$venv/bin/activate"' in ci


def test_constraints_pin_every_dependency_within_its_bound():
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version
    for spec in requires("causal-icl-probes"):  # pyproject's dependencies and extras, as installed
        req = Requirement(spec)
        name = req.name.lower().replace("_", "-")
        if name in ("torch", "causal-icl-probes"):  # torch is installed first, by itself (README); dev names
            continue  # the sweep extra by the project's own name, whose requirements are in this list too
        assert name in pins, f"constraints.txt does not pin {name}"
        assert req.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} outside {req.specifier}"


def test_default_out_is_named_for_the_checkpoint(tmp_path):
    assert common.default_out("default") == Path("runs/figures/default")
    assert common.default_out("theorem1:beta=50") == Path("runs/figures/theorem1_beta=50")
    assert common.default_out(None) == Path("runs/figures/synthetic")
    a, b = tmp_path / "x" / "run", tmp_path / "y" / "run"
    assert common.default_out(str(a)).name.startswith("run-")
    assert common.default_out(str(a)) != common.default_out(str(b))  # same name, other place: other folder


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def test_an_analysis_of_another_checkpoint_leaves_the_committed_figures_alone(tmp_path, monkeypatch, capsys):
    before = digests(common.FIGURES_DIR)
    monkeypatch.chdir(tmp_path)
    copyers.main(["--checkpoint", "theorem1:beta=50"])
    out = tmp_path / "runs" / "figures" / "theorem1_beta=50"
    written = sorted(p.name for p in out.iterdir())
    assert written == sorted(["copyers.png", "copyers.pdf", "copyers.json"])
    assert json.loads((out / "copyers.json").read_text())["checkpoint"] == "theorem1:beta=50"
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("wrote 3 files to runs/figures/theorem1_beta=50/")
    assert digests(common.FIGURES_DIR) == before


def test_a_hugging_face_folder_without_task_json_is_named(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel  # heavy: only this test needs it

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=3, n_positions=8, n_embd=8, n_layer=1, n_head=1)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"Hugging Face folder .*'gpt2'.* without task.json; add a task.json") as e:
        load_subject(tmp_path)
    assert "\n" not in str(e.value)
