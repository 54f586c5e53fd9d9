"""The library's inputs checked like the command line's (issue 52, sixth robustness pass): each case below was
reproduced on the code of eb77e40 (accepted, a wrong number, or a traceback) and is now refused where it is
called, in one line naming the argument and what was expected; from the shell, one line and exit 2."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from test_chen import write_checkpoint as write_chen

import models
from analyses import circuit, common, inspect
from models.interp.circuit import CircuitConfig, discover
from models.interp.interventions import ablate
from models.loading.named import NAMED
from models.plumbing.io import not_a_bug
from probes import parent_accuracy


@pytest.fixture(scope="module")
def standard():
    return models.load_subject("standard")


# --- the circuit's config: types, not only ranges (73 s of work before torch failed, on eb77e40) -------------
@pytest.mark.parametrize(
    "field, value, kind",
    [("n_edges", 2.5, TypeError), ("n_contexts", 2.5, TypeError), ("seed", 1.5, TypeError),
     ("seed", 2**70, ValueError), ("ig_steps", 8.0, TypeError), ("min_z", math.nan, ValueError),
     ("n_edges", True, TypeError)],
)  # fmt: skip
def test_a_circuit_config_refuses_a_value_of_the_wrong_type(field, value, kind):
    with pytest.raises(kind, match=f"^{field} must be"):
        CircuitConfig(**{field: value})


def test_discover_names_a_model_or_a_string_given_for_its_arguments(standard):
    with pytest.raises(TypeError, match=r"subject must be a models.Subject.*models.load_subject"):
        discover(standard.model, CircuitConfig(n_contexts=8))
    with pytest.raises(TypeError, match=r"config must be a CircuitConfig"):
        discover(standard, "n_contexts=8")


def test_nodes_level_refuses_n_edges_it_would_ignore():
    """``--level nodes --n-edges 1`` kept every edge among the nodes and the JSON still said top-n."""
    with pytest.raises(ValueError, match="^n_edges"):
        CircuitConfig(level="nodes", n_edges=1)
    with pytest.raises(SystemExit) as e:
        circuit.main(["--checkpoint", "standard", "--level", "nodes", "--n-edges", "1"])
    assert e.value.code == 2


def test_a_model_worse_than_the_plateau_is_called_worse_not_within_noise():
    from models.interp.circuit.discovery import _refused
    from models.interp.circuit.result import Estimate

    worse = _refused(Estimate(-1.276, 0.131), 128)
    assert "worse than the uniform-parent plateau" in worse and "not beyond 2 standard errors" not in worse
    assert "not beyond 2 standard errors of zero" in _refused(Estimate(0.01, 0.02), 128)
    assert _refused(Estimate(0.5, 0.02), 128) is None


# --- subjects, hooks and probes ----------------------------------------------------------------------------
def test_scored_positions_refuses_a_name_it_does_not_know(standard):
    assert standard.scored_positions("trained") == standard.trained_on and standard.scored_positions("last") == "last"
    with pytest.raises(ValueError, match="positions must be one of trained, all, last"):
        standard.scored_positions("foo")


def test_ablate_takes_head_indices_in_range(standard):
    """``ablate(subject, 0, "12")`` ablated heads 1 and 2; ``[99]`` on 8 heads failed inside the hook."""
    with pytest.raises(TypeError, match="heads must be a list of head indices"):
        ablate(standard, 0, "12")
    with pytest.raises(ValueError, match=r"head 99 of layer 0: layer 0 has heads 0\.\.7"):
        ablate(standard, 0, [99])
    with pytest.raises(ValueError, match=r"layer 5: the model has layers 0\.\.1"):
        ablate(standard, 5, [0])
    assert len(ablate(standard, 1, [0, 3])) == 1


def test_target_nll_refuses_tokens_that_are_not_the_log_probs_contexts():
    """``target_nll`` of log-probs over H = 12 targets with 10-column tokens returned 1.825."""
    from probes import target_nll

    log_probs = torch.full((2, 12, 5), -math.log(5), dtype=torch.float64)
    tokens = torch.zeros(2, 132, dtype=torch.long)
    assert target_nll(log_probs, tokens) == pytest.approx(math.log(5))  # uniform over 5: log 5 nats
    for bad in (tokens[:, :10], tokens[:1], tokens[:, :-1], tokens + 5):
        with pytest.raises(ValueError, match="tokens must be|must be ids in"):
            target_nll(log_probs, bad)


def test_parent_accuracy_refuses_nan_attention():
    """All-NaN attention scored 0.284 (argmax of NaN rows)."""
    parents = torch.tensor([[-1, 0, 1, 0]])
    assert parent_accuracy(torch.nn.functional.one_hot(parents.clamp_min(0), 4).double(), parents) == 1.0
    with pytest.raises(ValueError, match="attention holds NaN"):
        parent_accuracy(torch.full((1, 4, 4), math.nan), parents)


# --- the command line: sizes that give no standard error, devices that hold no values ----------------------
def test_inspect_needs_two_contexts_for_a_standard_error(capsys):
    """``inspect --n-contexts 1`` wrote 105 NaN standard errors into inspect.json with exit 0."""
    with pytest.raises(ValueError, match=r"n_contexts must be in \[2, "):
        inspect.Config(n_contexts=1)
    with pytest.raises(SystemExit) as e:
        inspect.main(["--n-contexts", "1"])
    assert e.value.code == 2 and "--n-contexts must be in [2, " in capsys.readouterr().err


def test_the_meta_device_is_refused_by_every_loader(tmp_path, capsys):
    """``--device meta`` loaded the model and then failed as a bug; ``models.load(device="meta")`` returned a
    model with no values."""
    with pytest.raises(ValueError, match="device 'meta' holds no values"):
        models.load("default", device="meta")
    with pytest.raises(ValueError, match="device 'meta' holds no values"):
        models.load_subject("default", device="meta")
    with pytest.raises(SystemExit) as e:
        common.run_cli(inspect.main, ["--device", "meta", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "holds no values" in err[0]


def test_the_allocators_refusal_is_the_system_refusing_not_a_bug():
    assert not_a_bug(MemoryError())
    assert not_a_bug(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not_a_bug(RuntimeError("[enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: not enough "
                                  "memory: you tried to allocate 51539607552 bytes."))  # fmt: skip
    assert not not_a_bug(RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"))


# --- files a run reads -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "edit, expected",
    [(lambda r: {**r, "loss_on": "Last"}, "last"), (lambda r: {**r, "loss_on": "target"}, "all"),
     (lambda r: {**r, "loss_on": ["last"]}, "loss_on must be one of all, target, last"),
     (lambda r: {**r, "loss_on": "first"}, "loss_on must be one of all, target, last"),
     (lambda r: [r], "holds a JSON list")],
)  # fmt: skip
def test_training_json_loss_on_is_read_or_refused_by_name(tmp_path, edit, expected):
    """``loss_on: "Last"`` was read as "all" (exit 0); a training.json that is a JSON list exited 1 with a
    traceback."""
    import shutil

    folder = tmp_path / "gpt2"
    shutil.copytree(NAMED["standard"], folder)
    record = json.loads((folder / "training.json").read_text())
    (folder / "training.json").write_text(json.dumps(edit(record)))
    if expected not in ("all", "last"):
        with pytest.raises(ValueError, match=expected):
            models.load_subject(folder)
    else:
        assert models.load_subject(folder).trained_on == expected


def test_chens_model_is_judged_on_the_last_token_it_predicts(tmp_path):
    """Chen et al.'s TwoLayerTransformer only ever predicts the last token (its read-out is the last row), as
    the CatFormer, which is judged there; it was judged on every position."""
    path = write_chen(tmp_path)[0]
    subject = models.load_subject(path)
    assert subject.family == "Chen" and subject.trained_on == "last" and subject.scored_positions() == "last"


# --- a resumed sweep ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "record, why",
    [({"parent_attention": math.nan}, "not finite"), ({"parent_attention": None, "last_nll": math.inf}, "not finite"),
     ({"parent_attention": "drop"}, "holds neither parent_attention"), ({"index": 25}, "index must be one of")],
)  # fmt: skip
def test_a_resumed_record_is_checked_before_it_is_counted(tmp_path, capsys, record, why):
    """A record holding NaN was counted (``"mean": NaN`` in the JSON, exit 0); one missing its key exited 1
    with a KeyError."""
    from analyses import nichani_dags

    line = {"index": 0, "model": "catformer", "edges": [[1, 0]], "parent_attention": 0.8, "last_nll": 0.5,
            "last_nll_bayes": 0.4, "run": {"steps": 3}}  # fmt: skip
    line.update(record)
    line = {k: v for k, v in line.items() if v != "drop"}
    partial = tmp_path / "nichani_dags_partial.jsonl"
    partial.write_text(json.dumps(line) + "\n")
    with pytest.raises(SystemExit) as e:
        common.run_cli(nichani_dags.main, ["--sweep", str(partial), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and why in err[0] and "line 1" in err[0], err
    assert not (tmp_path / "out" / "nichani_dags.json").exists()


def test_tutorials_check_reads_the_folder_it_is_given(tmp_path):
    """``tutorials.py --check --out MISSING`` exited 0, checking the committed renders instead."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "docs" / "scripts"))
    import tutorials

    assert tutorials.main(["five_minutes", "--check", "--out", str(tmp_path / "missing")]) == 1
    assert tutorials.main(["five_minutes", "--check"]) == 0  # the committed render is current


def test_loading_a_hugging_face_folder_moves_no_global_state():
    """Loading moved torch's global random generator and turned transformers' progress bars back on after the
    caller turned them off."""
    import transformers

    transformers.logging.disable_progress_bar()
    transformers.logging.set_verbosity_warning()
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    try:
        models.load_subject("standard")
        assert torch.equal(torch.rand(3), expected)
        assert not transformers.logging.is_progress_bar_enabled()
        assert transformers.logging.get_verbosity() == transformers.logging.WARNING
    finally:
        transformers.logging.enable_progress_bar()


@pytest.mark.parametrize("hook", ["unembed.hook_out", "unembed.hook_in"])
def test_a_hook_on_the_unembedding_fires_in_log_probs(standard, hook):
    """``log_probs`` stopped before the unembedding, so a hook there never fired and a logit-level edit gave
    unchanged numbers. Adding c to the logit of the task's first token changes its log-probability by the closed
    form log p' = log p + c - log(1 + p (e^c - 1)); the other tokens' by -log(1 + p (e^c - 1))."""
    tokens, _ = standard.task.sample(4, torch.Generator().manual_seed(0))
    first, c = standard.layout.token_offset, 2.0

    def add(x, hook):  # the logits [batch, pos, vocab] (or, at hook_in, the residual: scaled, not shifted)
        x = x.clone()
        if hook.name.endswith("hook_out"):
            x[..., first] += c
        else:
            x *= 0
        return x

    clean = standard.log_probs(tokens)
    edited = standard.log_probs(tokens, [(hook, add)])
    if hook.endswith("hook_out"):
        p0 = clean[..., 0].exp()
        shift = torch.log1p(p0 * (math.exp(c) - 1))
        assert torch.allclose(edited[..., 0], clean[..., 0] + c - shift, atol=1e-5)
        assert torch.allclose(edited[..., 1:], clean[..., 1:] - shift[..., None], atol=1e-5)
    else:  # a zero residual into the unembedding: every task token's logit is lm_head's bias (none in GPT-2): uniform
        assert torch.allclose(edited, torch.full_like(edited, -math.log(standard.task.d_vocab)), atol=1e-5)


@pytest.mark.parametrize("shape_or_id", ["an id outside the task", "twice the task's length", "one column short"])
def test_every_family_refuses_tokens_that_are_not_the_tasks(standard, tmp_path, shape_or_id):
    """A GPT-2 with 512 ids returned log-probs for contexts holding an id the task does not have; a CatFormer a
    result for tokens twice the task's length; the shipped GPT-2 a 28-frame IndexError."""
    chen = models.load_subject(write_chen(tmp_path)[0])
    for subject in (standard, models.load_subject("default"), chen):
        tokens, _ = subject.task.sample(2, torch.Generator().manual_seed(0))
        bad = {"an id outside the task": tokens.clone().fill_(subject.task.d_vocab),
               "twice the task's length": torch.cat([tokens, tokens], 1),
               "one column short": tokens[:, :-1]}[shape_or_id]  # fmt: skip
        with pytest.raises(ValueError, match=r"token ids must lie in \[0, \d+\)|tokens must have shape") as e:
            subject.log_probs(bad)
        assert "\n" not in str(e.value), subject.family


@pytest.mark.parametrize("n, error", [(0, "n_contexts must be in \\[2, "), (1, "n_contexts must be in \\[2, "),
                                      (2.5, "n_contexts must be an integer"), (10**7, "would need about")])
def test_inspect_subject_sizes_its_contexts_before_any_work(n, error):
    """From Python, ``inspect_subject(subject, n_contexts=10**9)`` asked the allocator for 48 GB and
    ``n_contexts=0`` failed inside torch.cat: the command line's checks were the only ones."""
    from models.interp.inspection import inspect_subject

    with pytest.raises(ValueError, match=error):
        inspect_subject(models.load_subject("default"), n_contexts=n)


@pytest.mark.parametrize("method", ["ZIP_BZIP2", "ZIP_LZMA"])
def test_an_npz_member_zipfile_would_decompress_unbounded_is_refused_before_decompression(tmp_path, monkeypatch, method):
    """An 11 KB .npz (bzip2) declaring a [1, 12000, 12000] float64 array was refused only after 2.5 GB were
    decompressed: Python's zipfile bounds deflate's output per read, not bzip2's or LZMA's, so even reading a
    member's 128-byte header expanded it. Such a member is now refused from the zip's own header: the
    decompressor is never called."""
    import bz2
    import io as stdio
    import lzma
    import zipfile

    import numpy as np

    path = tmp_path / "catformer.npz"
    with zipfile.ZipFile(path, "w", compression=getattr(zipfile, method)) as archive:
        for key, array in (("A.0", np.zeros((1, 8, 8), np.float32)), ("W", np.zeros((8, 3), np.float32))):
            buffer = stdio.BytesIO()
            np.lib.format.write_array(buffer, array)
            archive.writestr(f"{key}.npy", buffer.getvalue())

    def never(*args, **kwargs):
        raise AssertionError("a member was decompressed")

    monkeypatch.setattr(bz2, "BZ2Decompressor", never)
    monkeypatch.setattr(lzma, "LZMADecompressor", never)
    from models.loading.sources.catformer import read_npz  # what --checkpoint FILE.npz reads (with its task.json)

    with pytest.raises(ValueError, match="bzip2 or LZMA.*np.savez"):
        read_npz(path)


def test_attribution_is_sized_before_any_work(standard, monkeypatch):
    """``--method eap-ig --level edges --n-contexts 1024`` on the shipped GPT-2: check_fits estimated 1.4 GB and let
    it start; the allocator failed 64-91 s later under a 5 GB cap: EAP-IG takes the gradients of every context in
    one pass and keeps every receiver's gradient, and the check counted neither. Under a memory bound exactly as
    large as exact patching's largest need, exact is let through and EAP / EAP-IG are refused, in one line naming
    the method, before any context is drawn."""
    from models.interp.circuit import discovery

    graph = discovery.build_graph(standard)
    sizes = discovery.context_bytes(standard, graph)
    # a budget that keeps exact patching exact at 1024 contexts (6.6 TFLOP counted; the default is 6): memory is the point
    config = CircuitConfig(n_contexts=1024, level="edges", corruptions=("demonstrations",), exact_budget=100)
    needs = []
    monkeypatch.setattr(discovery, "check_memory", lambda need, what: needs.append(need))
    discovery.check_fits(standard, config, graph, "edges", sizes)
    free = max(needs)  # room for everything exact patching holds, and no more

    def bounded(need, what):
        if need > free:
            raise ValueError(f"{what} would need about {need}")

    monkeypatch.setattr(discovery, "check_memory", bounded)
    discovery.check_fits(standard, config, graph, "edges", sizes)  # exact: fits
    for method in ("eap", "eap-ig"):
        with pytest.raises(ValueError, match=f"with {method} .* a context for one pass with gradients"):
            discovery.check_fits(standard, dataclasses.replace(config, method=method), graph, "edges", sizes)
