"""Each how-to that changes the code is followed end to end in a copy of the repository: its example written
where the page says, only the files the page lists touched, and the result run through the public entry
point (``python -m ...`` in a fresh interpreter of the copy), its numbers checked against a computation
written here. write_analysis.md adds a toy analysis; add_format.md a toy checkpoint format."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import models
from probes import bma_predictive

ROOT = Path(__file__).resolve().parents[2]
HOWTO = ROOT / "docs" / "howto"
CODE = ("models", "probes", "cape", "analyses", "bench", "pyproject.toml")  # what an entry point runs from


def python_blocks(page: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```\n", (HOWTO / page).read_text(), re.S | re.M)


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file of the code, by path relative to ``root`` (caches left out)."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for part in CODE
        for p in ([root / part] if (root / part).is_file() else sorted((root / part).rglob("*")))
        if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.fixture
def repo(tmp_path) -> Path:
    """A copy of the repository's code, as a contributor's checkout would hold it."""
    copy = tmp_path / "repo"
    copy.mkdir()
    for part in CODE:
        source = ROOT / part
        if source.is_dir():
            shutil.copytree(source, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, copy / part)
    return copy


def run(repo: Path, *argv: str, importtime: bool = False) -> subprocess.CompletedProcess:
    """``python -m argv...`` in a fresh interpreter of the copy (its code first on the path)."""
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    flags = ["-X", "importtime"] if importtime else []
    return subprocess.run([sys.executable, *flags, "-m", *argv], cwd=repo, env=env, capture_output=True, text=True)


def changed(before: dict[str, bytes], after: dict[str, bytes]) -> set[str]:
    return {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}


@pytest.mark.slow
def test_write_analysis_page_end_to_end(repo, tmp_path):
    before = snapshot(repo)
    module, notebook = python_blocks("write_analysis.md")
    (repo / "analyses" / "mine.py").write_text(module)  # the page: "analyses/<name>.py ... Nothing else registers it"
    assert changed(before, snapshot(repo)) == {"analyses/mine.py"}

    # found by its file: the paper run's list, after the analyses ORDER names
    listed = subprocess.run(
        [sys.executable, "-c", "from analyses import common; print(common.analysis_names()[-1])"],
        cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)}, capture_output=True, text=True,
    )  # fmt: skip
    assert listed.stdout.split() == ["mine"], listed.stderr

    # --help before torch loads (the page's parse_first line), with the flag the page adds
    helped = run(repo, "analyses.mine", "--help", importtime=True)
    imported = {line.split("|")[-1].strip() for line in helped.stderr.splitlines() if line.startswith("import time:")}
    assert helped.returncode == 0 and "--from-position" in helped.stdout and "torch" not in imported

    # the run: PNG + PDF + JSON, and its numbers against the model's forward pass and BMA computed here
    out = tmp_path / "out"
    done = run(repo, "analyses.mine", "--checkpoint", "default", "--n-contexts", "32", "--seed", "5", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["mine.json", "mine.pdf", "mine.png"]
    record = json.loads((out / "mine.json").read_text())
    assert record["command"].startswith("python -m analyses.mine") and record["checkpoint"] == "default"
    task, model = models.load_task(models.DEFAULT_CHECKPOINT), models.load(models.DEFAULT_CHECKPOINT)
    tokens, _ = task.sample(32, torch.Generator().manual_seed(5))
    x = tokens[:, -task.seq_len :]
    with torch.no_grad():
        lp = model(tokens).double()  # [batch, H, d]: the network itself, not the subject
    bma = bma_predictive(task.pi, tokens, task.n_examples, task.seq_len, task.root, log=True)
    for name, want in (("model", lp), ("bma", bma)):
        per_position = np.array([[-want[b, h, x[b, h]].item() for h in range(task.seq_len)] for b in range(32)])
        np.testing.assert_allclose(record["results"][name], per_position.mean(0)[1:], rtol=1e-9)

    # bad input is one line and exit 2, before any work
    bad = run(repo, "analyses.mine", "--from-positon", "2")
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1 and "unrecognized arguments" in bad.stderr

    # the page's notebook block: the same numbers from Python as the command line's (both at 32 contexts, seed 5)
    script = notebook.replace("mine.Config(n_contexts=128)", "mine.Config(n_contexts=32, seed=5)")
    script += "\nimport json, sys; json.dump([record, again.to_dict()], sys.stdout)\n"
    (repo / "notebook.py").write_text(script)
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, "notebook.py"], cwd=repo, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    from_python, reseeded = json.loads(done.stdout.splitlines()[-1])
    assert from_python["results"] == record["results"] and reseeded["seed"] == 1
    assert reseeded["results"]["model"] != record["results"]["model"]


@pytest.mark.slow
def test_add_format_page_end_to_end(repo, tmp_path):
    before = snapshot(repo)
    (module,) = python_blocks("add_format.md")
    sources = repo / "models" / "loading" / "sources"
    (sources / "npz_weights.py").write_text(module)
    # the page: its name in the import list, and its line in FORMATS before catformer (which takes .npz too)
    init = sources / "__init__.py"
    text = init.read_text()
    text, imported = re.subn(r"(from models\.loading\.sources import \(\n)", r"\1    npz_weights,\n", text, count=1)
    text, listed = re.subn(r"(\n(\s+)catformer,  #)", r"\n\2npz_weights,  # our weights as a NumPy .npz\1", text, count=1)
    assert imported == listed == 1
    init.write_text(text)
    assert changed(before, snapshot(repo)) == {
        "models/loading/sources/npz_weights.py",
        "models/loading/sources/__init__.py",
    }

    # a toy checkpoint in the new format: the shipped model's weights, its task beside them
    model = models.load(models.DEFAULT_CHECKPOINT)
    toy = tmp_path / "toy"
    toy.mkdir()
    np.savez(toy / "model.npz", **{k: v.numpy() for k, v in model.state_dict().items()})
    (toy / "task.json").write_text(json.dumps(models.load_task(models.DEFAULT_CHECKPOINT).to_dict()))

    # through the public entry point: the same held-out metrics as the shipped checkpoint itself
    metrics = {}
    for name, spec in (("toy", str(toy / "model.npz")), ("shipped", "default")):
        done = run(repo, "models.evaluate", "--checkpoint", spec, "--n-contexts", "64", "--json", str(tmp_path / f"{name}.json"))
        assert done.returncode == 0, done.stderr[-3000:]
        metrics[name] = json.loads((tmp_path / f"{name}.json").read_text())
    for key in ("nll", "tv_to_bma", "parent_acc", "head_purity"):
        assert metrics["toy"][key] == metrics["shipped"][key], key

    # a file the format refuses is one line and exit 2, naming the weight: W_OV stored transposed
    weights = {k: v.numpy() for k, v in model.state_dict().items()}
    np.savez(toy / "model.npz", **{**weights, "blocks.1.attn.W_OV": weights["blocks.1.attn.W_OV"].T})
    refused = run(repo, "models.evaluate", "--checkpoint", str(toy / "model.npz"), "--n-contexts", "8")
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert "blocks.1.attn.W_OV" in refused.stderr
