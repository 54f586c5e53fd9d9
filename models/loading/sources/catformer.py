"""Nichani et al.'s CatFormer (``models.nets.catformer``) as a JAX user writes its pytree, task.json beside it:

    np.savez("catformer.npz", W=model.W, **{f"A.{i}": A for i, A in enumerate(model.A)})        # .npz
    pickle.dump({"A": [np.asarray(A) for A in model.A], "W": np.asarray(model.W)}, open("catformer.pkl", "wb"))

The leaves: ``A.{i}`` ``[n_heads_i, d_i, d_i]`` per layer and ``W`` ``[d_L, d]`` (also read: the names
``jax.tree_util.keystr`` gives, ``.A[0]`` and ``.W``). Their sizes give the vocabulary (W's columns), T
(``d_0 - d``) and the heads. A pickle is read by an unpickler that admits NumPy arrays, lists, dicts,
numbers and strings only: nothing is executed. The task's sequence is T + 1 tokens (their T inputs, then
the token their read-out predicts), so task.json's ``(L + 1) H`` must be T + 1. Its training positions are
the last token's (``Source.trained_on``): their read-out is the last position's, the only one a loss can use.
"""

from __future__ import annotations

import io
import pickle
import re
import zipfile

import numpy as np
import torch

from models.loading.sources.files import Found, Source
from models.loading.sources.task_json import read_task
from models.nets.catformer import CatFormer, CatFormerConfig
from models.plumbing.io import one_line

NAME = "CatFormer"
SUFFIXES = (".npz", ".pkl", ".pickle")
_LEAF = re.compile(r"^\.?(?:A[.\[_](\d+)\]?|(W))$")
_ARRAYS = {  # the globals a pickle of NumPy arrays names, and nothing else
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
}  # fmt: skip


class _ArraysOnly(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) not in _ARRAYS:
            raise pickle.UnpicklingError(f"it names {module}.{name}, which is not a NumPy array")
        return super().find_class(module, name)


def detect(found: Found) -> bool:
    return found.path.is_file() and found.path.suffix.lower() in SUFFIXES


def leaves(found: Found) -> dict[str, np.ndarray]:
    """``{"A.0": ..., "W": ...}`` from the file (one ValueError naming the file otherwise)."""
    path = found.path
    raw = found.bytes(path, "CatFormer weights")
    try:
        if path.suffix.lower() == ".npz":
            with np.load(io.BytesIO(raw), allow_pickle=False) as z:
                obj = {k: z[k] for k in z.files}
        else:
            obj = _ArraysOnly(io.BytesIO(raw)).load()
    except (pickle.UnpicklingError, zipfile.BadZipFile, ValueError, EOFError, OSError) as e:
        raise ValueError(f"{path}: not a CatFormer pytree of NumPy arrays ({one_line(e)})") from None
    if isinstance(obj, dict) and isinstance(obj.get("A"), (list, tuple)):
        obj = {**{f"A.{i}": a for i, a in enumerate(obj["A"])}, **{k: v for k, v in obj.items() if k != "A"}}
    if not isinstance(obj, dict):
        raise ValueError(f"{path} holds a {type(obj).__name__}; expected the leaves {{'A.0': ..., 'W': ...}}")
    out = {}
    for key, value in obj.items():
        m = _LEAF.match(str(key))
        if not m or not isinstance(value, np.ndarray):
            raise ValueError(f"{path}: entry {key!r} is not a CatFormer leaf; expected arrays A.0, A.1, ..., W")
        out["W" if m.group(2) else f"A.{int(m.group(1))}"] = value
    n = sum(k.startswith("A.") for k in out)
    if "W" not in out or n == 0 or any(f"A.{i}" not in out for i in range(n)):
        raise ValueError(f"{path} has leaves {sorted(out)}; expected A.0 .. A.{{L-1}} and W")
    return out


def build(arrays: dict[str, np.ndarray], where: str, device: str | None = None) -> CatFormer:
    """The CatFormer whose sizes the arrays give, loaded with them (float32 as theirs, float64 kept)."""
    W = arrays["W"]
    A = [arrays[f"A.{i}"] for i in range(sum(k.startswith("A.") for k in arrays))]
    if W.ndim != 2 or any(a.ndim != 3 or a.shape[1] != a.shape[2] for a in A):
        raise ValueError(
            f"{where}: W must be [d_L, d] and each A.i [heads, d_i, d_i]; got W {W.shape}, A {[a.shape for a in A]}"
        )
    d, T = W.shape[1], A[0].shape[1] - W.shape[1]
    cfg = CatFormerConfig(d_vocab=d, n_ctx=T, heads=[a.shape[0] for a in A], device=device or "cpu")
    if T < 1:
        raise ValueError(f"{where}: A.0 is {A[0].shape[1]} wide, not d + T with d = {d} (W's columns) and T >= 1")
    widths = cfg.widths()
    got, want = [a.shape[1] for a in A] + [W.shape[0]], widths
    if got != want:
        raise ValueError(
            f"{where}: widths {got} disagree with d_(i+1) = d_i (1 + heads_i) from d_0 = {widths[0]}: {want}"
        )
    model = CatFormer(cfg)
    dtype = torch.float64 if W.dtype == np.float64 else torch.float32
    state = {f"blocks.{i}.attn.A": torch.from_numpy(np.asarray(a, dtype=np.float64)) for i, a in enumerate(A)}
    state["W"] = torch.from_numpy(np.asarray(W, dtype=np.float64))
    if not all(torch.isfinite(t).all() for t in state.values()):
        raise ValueError(f"{where}: the weights hold NaN or Inf")
    model.load_state_dict(state)
    return model.to(dtype).to(cfg.device).eval()


def read(found: Found, device: str | None = None, *, weights: bool = True) -> Source:
    raw, where = (
        (found.json_arg(found.config, "task.json"), str(found.config))
        if found.config is not None
        else found.task_json_beside(NAME)
    )
    task, layout = read_task(raw, where)
    if not weights:
        return Source(None, task, layout, found.where, "", NAME)
    model = build(leaves(found), found.where, device)
    if layout.n_positions != model.cfg.n_ctx + 1 or layout.min_vocab > model.cfg.d_vocab:
        raise ValueError(
            f"{found.where}: a CatFormer of T = {model.cfg.n_ctx} positions and {model.cfg.d_vocab} tokens reads "
            f"contexts of T + 1 = {model.cfg.n_ctx + 1} tokens; the task has {layout.n_positions} of {layout.min_vocab}"
        )
    return Source(model, task, layout, found.where, found.digest(), NAME, trained_on="last")  # their read-out's
