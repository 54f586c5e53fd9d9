"""Issue 41: a weight is a real float in every family. A file whose one tensor is complex (its imaginary part
would be dropped with a warning) or integer (it would be cast without one) is refused by ``models.load`` in
one line naming the file, the tensor and its dtype, through the one check every format calls
(``models.loading.dtypes.check_real_float``). Each family's file is written as its own pipeline writes it (the
writers of ``test_formats``, ``test_formats_pipelines``, ``test_chen``, ``test_edelman``), with one tensor
changed; the same file unchanged loads (so the refusal is the dtype's)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch
from test_catformer import random_leaves
from test_chen import write_checkpoint as write_chen
from test_edelman import theirs  # noqa: F401 (a fixture: their Relative_Transformer and CfgNode)
from test_edelman import write_checkpoint as write_edelman
from test_formats import file_config, hf_folder, small_model
from test_formats_pipelines import small_task, tl_cfg_dict, tl_state, write_nanogpt, write_task

import models
from models.loading import checkpoint
from probes.graph_task import make_task

BAD = [torch.complex64, torch.int64]


def _retyped(value, dtype):
    """``value`` (a tensor or an array) as ``dtype``: complex with a non-zero imaginary part, or rounded."""
    if isinstance(value, np.ndarray):
        return (value + 0.5j).astype(np.complex64) if dtype.is_complex else np.round(value).astype(np.int64)
    return (value + 0.5j).to(dtype) if dtype.is_complex else value.round().to(dtype)


def _torch_file(path, edit):
    state = torch.load(path, weights_only=True)
    torch.save(edit(state), path)
    return path


def ours_pt(tmp_path, edit):
    model, task = small_model()
    torch.save(edit(dict(model.state_dict())), tmp_path / "w.pt")
    (tmp_path / "w.json").write_text(json.dumps(file_config(model, task)))
    return tmp_path / "w.pt", tmp_path / "w.pt", "blocks.0.attn.w_H"


def ours_folder(tmp_path, edit):
    model, task = small_model()
    models.save(model, tmp_path / "ckpt", task=task)
    weights = tmp_path / "ckpt" / checkpoint.WEIGHTS
    safetensors.torch.save_file(edit(safetensors.torch.load_file(weights)), weights)
    return tmp_path / "ckpt", weights, "blocks.0.attn.w_H"


def catformer_npz(tmp_path, edit):
    task = make_task("nichani_dag:index=0:kernel=dirichlet", 3, 0, 21, alpha=0.1)
    (tmp_path / "task.json").write_text(json.dumps(task.to_dict()))
    np.savez(tmp_path / "catformer.npz", **edit(random_leaves([1, 1])))
    return tmp_path / "catformer.npz", tmp_path / "catformer.npz", "A.0"


def catformer_safetensors(tmp_path, edit):
    task = make_task("nichani_dag:index=0:kernel=dirichlet", 3, 0, 21, alpha=0.1)
    (tmp_path / "task.json").write_text(json.dumps(task.to_dict()))
    leaves = {k: v.astype(np.float32) for k, v in random_leaves([1, 1]).items()}
    safetensors.numpy.save_file(edit(leaves), tmp_path / "catformer.safetensors")
    return tmp_path / "catformer.safetensors", tmp_path / "catformer.safetensors", "A.0"


def chen(tmp_path, edit):
    path = write_chen(tmp_path)[0]
    return _torch_file(path, edit), path, "layer1.W"


def nanogpt(tmp_path, edit):
    path = write_nanogpt(tmp_path / "nano", small_task(), {})[0]
    ckpt = torch.load(path, weights_only=True)
    ckpt["model"] = edit(ckpt["model"], "transformer.wpe.weight")
    torch.save(ckpt, path)
    return path, path, "transformer.wpe.weight"


def transformer_lens(tmp_path, edit):
    cfg = tl_cfg_dict(n_layers=1, d_model=8, d_head=4, n_heads=2, d_vocab=8, d_vocab_out=8, n_ctx=24, d_mlp=16)
    torch.save(edit(tl_state(cfg, True), "embed.W_E"), tmp_path / "w.pt")
    (tmp_path / "w.json").write_text(json.dumps(cfg))
    write_task(tmp_path, small_task(), {})
    return tmp_path / "w.pt", tmp_path / "w.pt", "embed.W_E"


def hugging_face(tmp_path, edit):
    folder = hf_folder(tmp_path)[0]
    weights = folder / "model.safetensors"
    safetensors.torch.save_file(edit(safetensors.torch.load_file(weights), "transformer.wpe.weight"), weights)
    return folder, folder, "wpe.weight"


FAMILIES = [ours_pt, ours_folder, catformer_npz, catformer_safetensors, chen, nanogpt, transformer_lens, hugging_face]


@pytest.fixture()
def edelman(theirs):  # noqa: F811 (the fixture imported above)
    def write(tmp_path, edit):
        path = write_edelman(tmp_path, theirs)[0]
        return _torch_file(path, lambda s: edit(s, "layers.0.Q.weight")), path, "layers.0.Q.weight"

    return write


def _editor(dtype):
    def edit(state, key=None):
        key = key or ("A.0" if "A.0" in state else "layer1.W" if "layer1.W" in state else "blocks.0.attn.w_H")
        return {**state, key: _retyped(state[key], dtype)}

    return edit


def _refused(write, tmp_path, dtype) -> None:
    spec, where, tensor = write(tmp_path / "good", lambda state, key=None: state)
    models.load(spec)  # the file as its pipeline wrote it loads
    spec, where, tensor = write(tmp_path / "bad", _editor(dtype))
    with pytest.raises(ValueError) as e:
        models.load(spec)
    message, name = str(e.value), str(dtype).removeprefix("torch.")
    code = {"complex64": "C64", "int64": "I64"}[name]  # as a safetensors header names it
    assert "\n" not in message and str(where) in message and tensor in message, message
    assert name in message or code in message, message


@pytest.mark.parametrize("dtype", BAD, ids=str)
@pytest.mark.parametrize("write", FAMILIES, ids=lambda f: f.__name__)
def test_a_complex_or_integer_weight_is_refused_by_file_tensor_and_dtype(tmp_path, write, dtype):
    (tmp_path / "good").mkdir()
    (tmp_path / "bad").mkdir()
    _refused(write, tmp_path, dtype)


@pytest.mark.parametrize("dtype", BAD, ids=str)
def test_a_complex_or_integer_edelman_weight_is_refused_by_file_tensor_and_dtype(tmp_path, edelman, dtype):
    (tmp_path / "good").mkdir()
    (tmp_path / "bad").mkdir()
    _refused(edelman, tmp_path, dtype)


def test_the_one_check_reads_every_form_of_a_dtype():
    """``check_real_float`` takes torch dtypes, NumPy dtypes (either byte order) and safetensors codes alike."""
    from models.loading.dtypes import check_real_float, weight_dtype_name

    for ok, name in [
        (torch.bfloat16, "bfloat16"),
        (np.dtype(">f4"), "float32"),
        ("F16", "float16"),
        ("float64", "float64"),
    ]:
        assert weight_dtype_name(ok) == name
        check_real_float(ok, "f", "t")
    for bad in [
        torch.complex128,
        torch.int8,
        torch.bool,
        np.dtype("c8"),
        np.dtype("i4"),
        np.dtype([("a", "<f4")]),
        "I64",
        "C64",
    ]:
        with pytest.raises(ValueError, match="f: 't' is of dtype .*; expected real float weights"):
            check_real_float(bad, "f", "t")
