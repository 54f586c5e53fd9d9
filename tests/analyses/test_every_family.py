"""Every analysis on every model family: given a standard language model (a tiny Hugging Face GPT-2 with a
task.json beside it), each analysis that takes ``--checkpoint`` either runs and writes its files, or exits 2
with one line that names what it needs and which analyses apply. Never a traceback."""

from __future__ import annotations

import dataclasses
import importlib
import json

import pytest
import torch

from analyses import common
from models.interp.subject import DISENTANGLED, StandardSubject, load_subject
from probes import MarkovTreeTask

WITH_CHECKPOINT = [name for name, a in common.registry().items() if a.requires is not None]


def module(name: str):
    try:
        return importlib.import_module(f"analyses.{name}")
    except ModuleNotFoundError as e:
        if e.name == f"analyses.{name}":
            pytest.skip(f"analyses.{name} is not in this tree")
        raise


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    """A randomly initialised 2-layer GPT-2 on a d=3, L=2, H=3 task, saved as Hugging Face writes it."""
    from transformers import GPT2Config, GPT2LMHeadModel

    task = MarkovTreeTask.random(3, 2, 3, seed=0)
    torch.manual_seed(0)
    hf = GPT2Config(vocab_size=3, n_positions=task.n_tokens, n_embd=16, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    folder = tmp_path_factory.mktemp("gpt2")
    GPT2LMHeadModel(hf).save_pretrained(folder)
    (folder / "task.json").write_text(json.dumps(task.to_dict()))
    return folder


def test_the_folder_loads_as_a_standard_subject(gpt2_folder):
    subject = load_subject(gpt2_folder)
    assert isinstance(subject, StandardSubject)
    assert subject.n_heads == [2, 2]
    tokens, _ = subject.task.sample(4, torch.Generator().manual_seed(0))
    lp = subject.log_probs(tokens)
    assert lp.shape == (4, 3, 3)
    assert torch.allclose(lp.exp().sum(-1), torch.ones(4, 3, dtype=lp.dtype))
    # Independently: the HF forward pass at flat position L*H + h - 1, restricted to the task's tokens.
    with torch.no_grad():
        logits = subject.model.original_model(tokens).logits
    expected = logits[:, torch.arange(3) + 2 * 3 - 1].double().log_softmax(-1)
    assert torch.allclose(lp, expected, atol=1e-5)


@pytest.mark.parametrize("name", WITH_CHECKPOINT)
def test_each_analysis_runs_or_refuses_in_one_line(name, gpt2_folder, tmp_path, capsys):
    mod = module(name)
    fields = {f.name for f in dataclasses.fields(mod.Config)}
    quick = {**({"n_contexts": 16} if "n_contexts" in fields else {}), **getattr(mod, "QUICK_CONFIG", {})}
    argv = ["--checkpoint", str(gpt2_folder), "--out", str(tmp_path / "out"), *mod.Config(**quick).flags()]
    try:
        mod.main(argv)
    except SystemExit as e:
        err = capsys.readouterr().err.strip().splitlines()
        assert e.code == 2, err
        assert len(err) == 1 and err[0].startswith(f"python -m analyses.{name}: error: "), err
        needs = mod.ANALYSIS.requires
        if DISENTANGLED in needs:
            assert DISENTANGLED in err[-1] and "Analyses that apply to it: " in err[-1]
        return
    written = sorted(p.suffix for p in (tmp_path / "out").iterdir() if not p.name.startswith("."))
    drawn = (".png", ".pdf") if mod.ANALYSIS.figures is not None else (".html",)  # attention_view: a page
    assert ".json" in written and all(suffix in written for suffix in drawn), written
