"""models.loading.sources: plain state dicts, key maps, bare safetensors, Hugging Face folders (models.standard)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import safetensors.torch
import torch
from conftest import build_task

import models
from models.training.standard import (
    StandardConfig,
    build_gpt2,
    save_standard,
    target_log_probs,
)
from probes.oracles import uniform_parent_predictive


def small_model(task=None, beta: float = 3.0):
    """A Theorem 1 model on a small task with a non-trivial root bias (every weight matters)."""
    task = task or build_task()
    model = models.theorem1_model(task.pi, task.n_examples, task.seq_len, beta, dtype="float32")
    with torch.no_grad():
        model.blocks[0].attn.w_H.add_(torch.randn_like(model.blocks[0].attn.w_H))
        model.b_root.copy_(torch.randn(task.d_vocab))
    return model, task


def file_config(model, task) -> dict:
    return {"model": model.cfg.to_dict(), "task": task.to_dict()}


def hf_folder(tmp_path, task=None, name: str = "hf"):
    """An untrained GPT-2 saved as a Hugging Face folder with task.json; returns (folder, hf model, task)."""
    task = task or build_task()
    sizes = dict(d_vocab=task.d_vocab, n_examples=task.n_examples, seq_len=task.seq_len)
    cfg = StandardConfig(**sizes, n_layers=2, n_heads=2, d_model=8, init_std=0.3)
    torch.manual_seed(0)
    hf = build_gpt2(cfg, task.n_tokens).eval()
    save_standard(hf, tmp_path / name, task, {"config": {}, "history": []})
    return tmp_path / name, hf, task


def test_pt_with_prefixes_round_trips(tmp_path):
    model, task = small_model()
    state = {f"_orig_mod.module.{k}": v for k, v in model.state_dict().items()}
    torch.save({"state_dict": state}, tmp_path / "w.pt")
    (tmp_path / "w.json").write_text(json.dumps(file_config(model, task)))  # found beside the file
    loaded = models.load(tmp_path / "w.pt")
    tokens, _ = task.sample(16, torch.Generator().manual_seed(1))
    assert torch.equal(loaded(tokens), model(tokens))


def test_key_map_transposes_and_reshapes(tmp_path):
    model, task = small_model()
    sd = model.state_dict()
    theirs = {
        "copy.pos": sd["blocks.0.attn.w_H"],
        "copy.demo": sd["blocks.0.attn.w_L"].flatten(),
        "select.W": sd["blocks.1.attn.W_KQ"].T.contiguous(),
        "select.V": sd["blocks.1.attn.W_OV"],
        "b_root": sd["b_root"],
    }
    safetensors.torch.save_file(theirs, tmp_path / "w.safetensors")
    key_map = {
        "copy.pos": "blocks.0.attn.w_H",
        "copy.demo": {"to": "blocks.0.attn.w_L", "reshape": list(sd["blocks.0.attn.w_L"].shape)},
        "select.W": {"to": "blocks.1.attn.W_KQ", "transpose": True},
        "select.V": "blocks.1.attn.W_OV",
    }
    (tmp_path / "map.json").write_text(json.dumps(key_map))
    (tmp_path / "task.json").write_text(json.dumps(task.to_dict()))  # bare task.json: K = L
    loaded = models.load(tmp_path / "w.safetensors", key_map=tmp_path / "map.json")
    for k, v in sd.items():
        assert torch.equal(loaded.state_dict()[k], v), k


def test_mismatch_lists_missing_unexpected_and_shapes(tmp_path):
    model, task = small_model()
    sd = dict(model.state_dict())
    del sd["b_root"]
    sd["extra"] = torch.zeros(2)
    sd["blocks.1.attn.W_OV"] = torch.zeros(3, 3)
    torch.save(sd, tmp_path / "w.bin")
    with pytest.raises(ValueError) as err:
        models.load(tmp_path / "w.bin", config=file_config(model, task))
    msg = str(err.value)
    D, d = model.cfg.d_model, task.d_vocab
    assert "\n" not in msg
    assert f"missing b_root ({d},)" in msg and "unexpected extra" in msg
    assert f"blocks.1.attn.W_OV: got (3, 3), expected ({D}, {d})" in msg


def test_hf_folder_loads_through_the_bridge_with_the_ordinary_shift(tmp_path):
    folder, hf, task = hf_folder(tmp_path)
    bridge = models.load(folder)
    tokens, _ = task.sample(3, torch.Generator().manual_seed(2))
    got = target_log_probs(bridge, tokens, task)
    # Brute force: the prediction of x_h is the LAST logit of the prefix that ends just before x_h.
    L, H = task.n_examples, task.seq_len
    for h in range(H):
        prefix = tokens[:, : L * H + h]
        want = hf(prefix).logits[:, -1].log_softmax(-1)
        assert torch.allclose(got[:, h], want, atol=1e-5), h


def test_gpt2s_activation_runs_fused_and_equals_its_formula(tmp_path):
    """A Hugging Face GPT-2 is loaded with torch's fused tanh GELU in place of ``NewGELUActivation`` (the same
    formula spelled in tensor ops, 3x slower), as is our own ``gelu_new``: both equal the formula computed in
    float64 to float32 rounding, and the loaded model still equals the untouched HF forward (the test above)."""
    import math

    from transformers.activations import NewGELUActivation

    from models.nets.hooked_transformer import gelu_new

    folder, hf, _ = hf_folder(tmp_path)
    assert any(type(m) is NewGELUActivation for m in hf.modules())  # what transformers builds
    bridge = models.load(folder)
    assert not any(type(m) is NewGELUActivation for m in bridge.modules())
    act = next(m for m in bridge.modules() if type(m).__name__ == "GELUTanh")
    x = torch.linspace(-8, 8, 100_001)
    exact = (lambda z: 0.5 * z * (1 + torch.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3))))(x.double())
    for f in (act, gelu_new):
        assert (f(x).double() - exact).abs().max() < 4 * torch.finfo(torch.float32).eps * 8


def test_uniform_parent_plateau_is_the_mean_of_pi_rows():
    task = build_task()
    tokens, _ = task.sample(4, torch.Generator().manual_seed(3))
    got = uniform_parent_predictive(task, tokens, log=False).numpy()
    pi, H = task.pi.numpy(), task.seq_len
    target = tokens[:, -H:].numpy()
    for b in range(4):
        for h in range(1, H):
            np.testing.assert_allclose(got[b, h], pi[target[b, :h]].mean(0), atol=1e-12)


def test_a_pass_with_gradients_leaves_no_autograd_graph_on_the_bridge():
    """TransformerLens's attention bridge keeps each forward's pattern on its module (``_pattern``), and with it the
    pass's autograd graph, until the next forward: the node attribution's memory grew part by part on a deep model
    (issue 51). After a pass with gradients on the shipped GPT-2, no module holds a tensor that is in a graph."""
    subject = models.load_subject("standard")
    tokens = subject.task.sample(4, torch.Generator().manual_seed(0))[0]

    def leaf(x, hook):
        return x.detach().requires_grad_(True)

    with torch.enable_grad():
        lp = subject.log_probs(tokens, [("hook_embed", leaf)])
        assert lp.grad_fn is not None
        lp.sum().backward()
    held = [(name, key) for name, module in subject.model.named_modules() for key, value in vars(module).items()
            if isinstance(value, torch.Tensor) and value.grad_fn is not None]  # fmt: skip
    assert held == []
