"""Chen et al.'s two-layer transformer (``models.nets.chen``): a state dict with the parameter names and shapes
their ``TwoLayerTransformer`` (``gszfwsb/Unveiling-Induction-Heads``, ``RPE/model.py``) saves loads, and
matches a NumPy forward written here from that file's equations (``RPEAttention.forward``: the W_h diagonals,
the 1e-6 self score, the appended zero row, the shared LayerNorm; ``PolyKernelMultiHeadAttention``: the
relu'd component products, C_alpha^2 over the norm of the alpha_0 = 0 part, times a; their repository has no
licence, so none of its code is here). The analyses run on it or refuse in one line."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
from inproc import analysis

import models
from probes.graph_task import make_task


def their_state(S=3, T=12, H=3, low_degree=2, seed=0) -> dict[str, torch.Tensor]:
    """What ``torch.save(model.state_dict())`` of their TwoLayerTransformer(S, T, H, ...) holds, moved off
    their initialisation (W = w_minus with w_plus on the diagonal, 0.01 identities, C = a = 0.01)."""
    g = torch.Generator().manual_seed(seed)
    degree = torch.tensor(list(itertools.product(range(2), repeat=H + 1)), dtype=torch.float32)
    n = len(degree) if low_degree == -1 else int((degree.sum(1) <= low_degree).sum())
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return {
        "layer1.W": r(T, H),
        "layer1.q_proj": r(S, S, H),
        "layer1.k_proj": r(S, S, H),
        "layer1.o_v_proj": r(S, S, H),
        "layer1.norm.weight": 1 + 0.3 * r(S),
        "layer1.norm.bias": 0.3 * r(S),
        "layer2.C_alpha_list": r(1, n),
        "layer2.a": 3 * r(1).abs(),
        "layer2.mydegree": degree,
    }


def their_forward(state, X: np.ndarray, low_degree=2) -> np.ndarray:
    """Their TwoLayerTransformer.forward on one-hot X [batch, T', S] (T' <= T), in float64: [batch, S]."""
    p = {k: v.double().numpy() for k, v in state.items()}
    B, T, S = X.shape
    H = p["layer1.W"].shape[1]
    Xt = np.concatenate([X, np.zeros((B, 1, S))], 1)  # X_tilde [B, T+1, S]
    V = [Xt]
    for h in range(H):
        Wh = np.full((T + 1, T + 1), -np.inf)
        for j in range(H):
            if j + h + 1 <= T:
                idx = np.arange(T + 1 - (j + h + 1))
                Wh[idx + j + h + 1, idx] = p["layer1.W"][j + h, h]
        Wh[np.arange(T + 1), np.arange(T + 1)] = 1e-6
        QK = p["layer1.q_proj"][:, :, h] @ p["layer1.k_proj"][:, :, h].T
        s = Xt @ QK @ Xt.transpose(0, 2, 1) + Wh
        A = np.exp(s - s.max(-1, keepdims=True))
        A /= A.sum(-1, keepdims=True)
        v = A @ Xt @ p["layer1.o_v_proj"][:, :, h]
        mu, var = v.mean(-1, keepdims=True), v.var(-1, keepdims=True)
        V.append((v - mu) / np.sqrt(var + 1e-5) * p["layer1.norm.weight"] + p["layer1.norm.bias"])
    V = np.stack(V, 2)  # [B, T+1, H+1, S]
    q, k = V[:, -1], V[:, :-1]  # [B, H+1, S], [B, T, H+1, S]
    e = np.maximum(np.einsum("bcd,bscd->bsc", q, k), 0)
    deg = p["layer2.mydegree"]
    deg = deg if low_degree == -1 else deg[deg.sum(1) <= low_degree]
    feats = np.prod((e[:, :, None, :] + 1e-24) ** deg, -1)  # [B, T, n]
    C2 = p["layer2.C_alpha_list"][0] ** 2
    shift = feats @ C2 / C2[deg[:, 0] == 0].sum() * p["layer2.a"][0]
    w = np.exp(shift - shift.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return np.einsum("bs,bsd->bd", w, X)


def write_checkpoint(folder, S=3, T=12, H=3, low_degree=2, seed=0):
    state = their_state(S, T, H, low_degree, seed)
    torch.save(state, folder / "model.pt")
    task = make_task("ngram:kernel=dirichlet:n=3", S, 0, T + 1, alpha=1.0)
    (folder / "task.json").write_text(json.dumps(task.to_dict()))
    return folder / "model.pt", state


@pytest.mark.parametrize("kw", [{}, {"H": 2, "low_degree": -1}, {"S": 4, "H": 4, "low_degree": 1}])
def test_their_state_dict_loads_and_matches_their_forward(tmp_path, kw):
    path, state = write_checkpoint(tmp_path, **kw)
    subject = models.load_subject(path)
    S, T, H = kw.get("S", 3), 12, kw.get("H", 3)
    assert subject.n_heads == [H, 1]
    assert subject.model.cfg.low_degree == kw.get("low_degree", 2)
    ids = torch.randint(0, S, (5, T), generator=torch.Generator().manual_seed(1))
    X = np.eye(S)[ids.numpy()]
    with torch.no_grad():
        ours = subject.model(ids).double().numpy()  # [batch, T, S]: position p predicts token p + 1
    for t in (1, 2, H, T - 1, T):  # their forward on the first t tokens is our position t - 1
        theirs = their_forward(state, X[:, :t], kw.get("low_degree", 2))
        np.testing.assert_allclose(ours[:, t - 1], theirs, atol=2e-6, rtol=0)


def test_missing_or_misshapen_keys_are_one_line(tmp_path):
    path, state = write_checkpoint(tmp_path)
    torch.save({k: v for k, v in state.items() if k != "layer1.o_v_proj"}, path)
    with pytest.raises(ValueError, match="lacks layer1.o_v_proj") as e:
        models.load_subject(path)
    assert "\n" not in str(e.value)
    torch.save({**state, "layer1.norm.bias": torch.zeros(4)}, path)
    with pytest.raises(ValueError, match="shape"):
        models.load_subject(path)
    torch.save({**state, "layer2.mydegree": state["layer2.mydegree"].flip(0)}, path)
    with pytest.raises(ValueError, match="mydegree"):
        models.load_subject(path)


def test_inspect_runs(tmp_path):
    path, _ = write_checkpoint(tmp_path)
    r = analysis("inspect", path, tmp_path / "inspect", "--n-contexts", "64")
    assert r.returncode == 0, r.stderr[-2000:]
    heads = json.dumps(json.loads((tmp_path / "inspect" / "inspect.json").read_text()))
    assert "L0H2" in heads and "L1H0" in heads


@pytest.mark.parametrize("name", ["circuit", "head_ablation", "logpi_recovery", "block_structure"])
def test_the_others_refuse_in_one_line(tmp_path, name):
    """They need a Markov-tree task, the disentangled residual or bilinear blocks, which this family lacks."""
    path, _ = write_checkpoint(tmp_path)
    r = analysis(name, path, tmp_path / name)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (name, r.returncode, r.stderr[-2000:])
    assert "Chen model" in r.stderr and not (tmp_path / name).exists()
