"""Nichani et al.'s CatFormer (``models.nets.catformer``, ``models.loading.sources.catformer``): files written as a JAX
user exports the pytree (``np.savez`` of the named leaves, or safetensors) load and match a NumPy
forward pass written from their published equations (``catformer.py``: their repository has no licence, so
nothing of it is vendored); the analyses run on it or refuse in one line."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest
import safetensors.numpy
import torch
from inproc import analysis

import models
from probes.graph_task import make_task

D, T = 3, 20


def reference(tokens: np.ndarray, A: list[np.ndarray], W: np.ndarray) -> np.ndarray:
    """Their CatFormer.__call__ for one sequence, softmax(x_L[-1] @ W), at every position [T, d] (the last
    row is theirs; causal masking makes row t the read-out of the first t + 1 tokens); x_0 = [onehot(token), onehot(pos)],
    x_{i+1} = [x_i, attn_0(x_i), attn_1(x_i), ...], attn(x) = softmax(mask(x A x^T)) x."""
    x = np.concatenate([np.eye(D)[tokens], np.eye(len(tokens))], -1)
    for Ai in A:
        heads = []
        for a in Ai:
            s = np.where(np.tri(len(tokens)) > 0, x @ a @ x.T, -np.inf)
            p = np.exp(s - s.max(-1, keepdims=True))
            heads.append((p / p.sum(-1, keepdims=True)) @ x)
        x = np.concatenate([x, *heads], -1)
    z = x @ W
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def random_leaves(heads: list[int], seed: int = 0) -> dict[str, np.ndarray]:
    rng, d, out = np.random.default_rng(seed), D + T, {}
    for i, n in enumerate(heads):
        out[f"A.{i}"] = rng.normal(size=(n, d, d)) / np.sqrt(d) * 3
        d *= 1 + n
    out["W"] = rng.normal(size=(d, D))
    return out


@pytest.fixture()
def folder(tmp_path):
    task = make_task("nichani_dag:index=0:kernel=dirichlet", D, 0, T + 1, alpha=0.1)
    (tmp_path / "task.json").write_text(json.dumps(task.to_dict()))
    return tmp_path


@pytest.mark.parametrize("heads", [[1, 1], [2, 1], [1, 2, 1]])
@pytest.mark.parametrize("fmt", ["npz", "npz_compressed", "safetensors"])
def test_loads_and_matches_their_equations(folder, heads, fmt):
    leaves = random_leaves(heads)
    if fmt == "safetensors":
        path = folder / "catformer.safetensors"
        safetensors.numpy.save_file(leaves, path)
    else:
        path = folder / "catformer.npz"
        (np.savez if fmt == "npz" else np.savez_compressed)(path, **leaves)
    subject = models.load_subject(path)
    assert subject.family == "CatFormer" and subject.n_heads == heads
    tokens, _ = subject.task.sample(6, torch.Generator().manual_seed(1))
    with torch.no_grad():
        probs = subject.log_probs(tokens).exp().numpy()  # [batch, H, d]: row h from position h - 1
    A = [leaves[f"A.{i}"] for i in range(len(heads))]
    for b in range(len(tokens)):
        theirs = reference(tokens[b, :T].numpy(), A, leaves["W"])  # [T, d]; the last row what their model returns
        np.testing.assert_allclose(probs[b, 1:], theirs, rtol=1e-5, atol=1e-6)  # float32 against float64
        np.testing.assert_allclose(probs[b, 0], np.full(D, 1 / D))  # the first token: nothing predicts it


def test_hooks_are_what_they_say(folder):
    np.savez(folder / "catformer.npz", **random_leaves([2, 1]))
    model = models.load_subject(folder / "catformer.npz").model
    ids = torch.randint(0, D, (3, T))
    _, cache = model.run_with_cache(ids)
    z = cache["blocks.0.attn.hook_z"]  # [batch, pos, head, d_0]
    assert z.shape == (3, T, 2, D + T)
    assert torch.allclose(cache["blocks.0.hook_resid_post"][..., D + T :], z.flatten(2))
    pattern = cache["blocks.0.attn.hook_pattern"]
    assert torch.allclose(pattern.sum(-1), torch.ones(3, 2, T, dtype=pattern.dtype)) and (pattern.triu(1) == 0).all()
    zeroed = model.run_with_hooks(ids, fwd_hooks=[("blocks.0.attn.hook_z", lambda z, hook: z * 0)])
    assert torch.equal(cache["hook_embed"][..., :D].argmax(-1), ids)
    assert not torch.allclose(zeroed, model(ids))  # ablating the copies changes the read-out


def test_a_pickle_is_refused_unread_with_the_line_that_exports_the_pytree(folder, tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    path = folder / "catformer.pkl"
    path.write_bytes(pickle.dumps({"A": [Evil()], "W": np.zeros((3, 3))}))
    with pytest.raises(ValueError, match="is a pickle: CatFormer weights are read from a .npz") as e:
        models.load_subject(path)
    assert not (tmp_path / "pwned").exists()
    # the line it gives, run on a pytree as theirs (A: a list of [heads, d_i, d_i] arrays, W: [d_L, d]), loads
    leaves = random_leaves([1, 1])
    model = type("CatFormer", (), {"A": [leaves["A.0"], leaves["A.1"]], "W": leaves["W"]})()
    export = str(e.value).split("export the pytree with ", 1)[1]
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        exec(export, {"np": np, "model": model})
    finally:
        os.chdir(cwd)
    assert models.load_subject(folder / "catformer.npz").n_heads == [1, 1]


def test_bad_shapes_are_one_line(folder):
    leaves = random_leaves([1, 1])
    leaves["W"] = leaves["W"][:10]
    np.savez(folder / "catformer.npz", **leaves)
    with pytest.raises(ValueError, match="widths"):
        models.load_subject(folder / "catformer.npz")


def test_analyses_run_or_refuse_in_one_line(folder):
    leaves = random_leaves([1, 1])
    np.savez(folder / "catformer.npz", **leaves)
    path = folder / "catformer.npz"
    ok = analysis("inspect", path, folder / "inspect", "--n-contexts", "64")
    assert ok.returncode == 0, ok.stderr
    bs = analysis("block_structure", path, folder / "bs")
    assert bs.returncode == 0, bs.stderr
    res = json.loads((folder / "bs" / "block_structure.json").read_text())["results"]
    assert [h["blocks"] for h in res["heads"]] == [["token", "position"], ["token", "position", "L0H0 copy"]]
    A0 = leaves["A.0"][0]
    assert res["heads"][0]["norms"][1][0] == pytest.approx(np.linalg.norm(A0[D:, :D]))
    # Nichani et al.'s measure, from their equations: softmax of layer 0's masked positional block on parents
    P = np.where(np.tri(T) > 0, A0[D:, D:], -np.inf)
    soft = np.exp(P - P.max(-1, keepdims=True))
    soft /= soft.sum(-1, keepdims=True)
    task = make_task("nichani_dag:index=0:kernel=dirichlet", D, 0, T + 1, alpha=0.1)
    edges = [(i, ps[0]) for i, ps in enumerate(task.parents[:T]) if ps]
    assert res["parent_attention"] == pytest.approx(np.mean([soft[i, p] for i, p in edges]))
    for name in ("circuit", "head_ablation", "logpi_recovery"):
        r = analysis(name, path, folder / name)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (name, r.stderr)
        assert "CatFormer model" in r.stderr
