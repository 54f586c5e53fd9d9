"""Nichani et al.'s CatFormer (``models.nets.catformer``) as a JAX user exports its pytree, task.json beside it:

    np.savez("catformer.npz", W=np.asarray(model.W), **{f"A.{i}": np.asarray(A) for i, A in enumerate(model.A)})

(their ``CatFormer`` is a ``simple_pytree.Pytree`` with ``A``, a list of ``[n_heads_i, d_i, d_i]`` arrays, and
``W``, ``[d_L, d]``; their code saves no weights, so this line is the export), or the same dict through
``safetensors.numpy.save_file`` into a ``.safetensors`` file. The leaves are ``A.{i}`` and ``W`` (also read:
the names ``jax.tree_util.keystr`` gives, ``.A[0]`` and ``.W``). Their sizes give the vocabulary (W's
columns), T (``d_0 - d``) and the heads. The task's sequence is T + 1 tokens (their T inputs, then the
token their read-out predicts), so task.json's ``(L + 1) H`` must be T + 1. Its training positions are the
last token's (``Source.trained_on``): their read-out is the last position's, the only one a loss can use.

Nothing is unpickled: a ``.pkl``/``.pickle`` is refused unread, with the line above (a pickle of NumPy arrays
names ``numpy.dtype``, whose state can place fields anywhere in memory). A ``.npz`` is read as a zip of
``.npy`` members: every member's header (its shape and dtype) is read first, without decompressing its
data; then the arrays whose headers declare real floats (``models.loading.dtypes``) of at most ``MAX_BYTES``
in all are read, with ``allow_pickle=False``.
"""

from __future__ import annotations

import math
import re
import zipfile
from pathlib import Path

import numpy as np
import safetensors
import torch

from models.loading.dtypes import check_real_float, check_tensor_kinds
from models.loading.sources.files import SAFETENSORS_SUFFIX, Found, Source
from models.loading.sources.task_json import read_task
from models.nets.catformer import CatFormer, CatFormerConfig
from models.plumbing import io
from models.plumbing.io import UsageError, one_line

NAME = "CatFormer"
NPZ, PICKLES = ".npz", (".pkl", ".pickle")
SUFFIXES = (NPZ, *PICKLES)
EXPORT = 'np.savez("catformer.npz", W=np.asarray(model.W), **{f"A.{i}": np.asarray(A) for i, A in enumerate(model.A)})'
MAX_BYTES = 256 * 2**20  # the leaves as their headers declare them (their models: a few hundred KB)
MAX_LEAVES = 1000  # members of a .npz (their models: L + 1, L a few layers)
_LEAF = re.compile(r"^\.?(?:A[.\[_](\d+)\]?|(W))$")
_NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def detect(found: Found) -> bool:
    """A ``.npz`` or a pickle (refused), or a ``.safetensors`` whose tensors are all CatFormer leaves, W among them."""
    path = found.path
    if not path.is_file():
        return False
    if path.suffix.lower() in SUFFIXES:
        return True
    return path.suffix.lower() == SAFETENSORS_SUFFIX and _safetensors_keys(path) is not None


def _safetensors_keys(path: Path) -> list[str] | None:
    """The names in a safetensors file's header if every one is a CatFormer leaf and W is one; else None."""
    try:
        with io.openable(path) as name, safetensors.safe_open(str(name), "np") as f:
            keys = list(f.keys())
    except Exception:  # not a readable safetensors file: the formats after this one say what it is
        return None
    matched = [_LEAF.match(k) for k in keys]
    return keys if keys and all(matched) and any(m.group(2) for m in matched) else None


def refuse_pickle(path: Path) -> None:
    raise UsageError(
        f"{path} is a pickle: CatFormer weights are read from a .npz or a .safetensors file, never unpickled (a "
        f"pickle can run code and place NumPy arrays anywhere in memory); export the pytree with {EXPORT}"
    )


def leaves(found: Found) -> dict[str, np.ndarray]:
    """``{"A.0": ..., "W": ...}`` from the file, every leaf a real float array (one ValueError naming the file
    and the leaf otherwise)."""
    path = found.path
    if path.suffix.lower() in PICKLES:
        refuse_pickle(path)
    obj = read_npz(path) if path.suffix.lower() == NPZ else _read_safetensors(found)
    out = {}
    for key, value in obj.items():
        m = _LEAF.match(key)
        if not m:
            raise UsageError(f"{path}: entry {key!r} is not a CatFormer leaf; expected arrays A.0, A.1, ..., W")
        out["W" if m.group(2) else f"A.{int(m.group(1))}"] = value
    n = sum(k.startswith("A.") for k in out)
    if "W" not in out or n == 0 or any(f"A.{i}" not in out for i in range(n)):
        raise UsageError(f"{path} has leaves {sorted(out)}; expected A.0 .. A.{{L-1}} and W")
    return out


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of the ``.npz`` at ``path``, once every member's ``.npy`` header is read and checked: a real
    float dtype, and ``MAX_BYTES`` in all as the shapes declare them (a bzip2 member of a few KB may declare
    GBs); then each array read with ``allow_pickle=False``."""
    try:
        with io.openable(path) as name, zipfile.ZipFile(name) as archive:
            declared = _npz_headers(archive, path)
            total = sum(math.prod(shape) * dtype.itemsize for shape, dtype in declared.values())
            if total > MAX_BYTES:
                big = max(declared, key=lambda k: math.prod(declared[k][0]) * declared[k][1].itemsize)
                raise UsageError(
                    f"{path}: its arrays declare {io.size(total)} (the largest, {big!r}, {list(declared[big][0])} of "
                    f"{declared[big][1].name}); expected at most {io.size(MAX_BYTES)} for a CatFormer's leaves"
                )
            io.check_memory(2 * total, f"reading {path} (the leaves, and their copies in the model)")
            out = {}
            for key in declared:
                with archive.open(f"{key}.npy") as member:
                    out[key] = _library(lambda: np.lib.format.read_array(member, allow_pickle=False), path)
            return out
    except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, RuntimeError) as e:
        raise UsageError(f"{path} is not a .npz archive of NumPy arrays ({one_line(e)})") from None


def _npz_headers(archive: zipfile.ZipFile, path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """{leaf: (shape, dtype)} from each member's .npy header, read without decompressing the data after it."""
    infos = archive.infolist()
    if len(infos) > MAX_LEAVES:
        raise UsageError(f"{path} has {len(infos)} members; expected the leaves of a CatFormer (A.0, ..., W)")
    declared = {}
    for info in infos:
        key = info.filename.removesuffix(".npy")
        if key == info.filename:
            raise UsageError(f"{path}: member {info.filename!r} is not a .npy array; expected A.0.npy, ..., W.npy")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):  # zipfile bounds deflate's output only
            raise UsageError(f"{path}: member {info.filename!r} is compressed with method {info.compress_type} "
                             "(bzip2 or LZMA, which Python decompresses unbounded even to read a header); expected "
                             "np.savez (stored) or np.savez_compressed (deflate)")  # fmt: skip
        with archive.open(info) as member:
            version = _library(lambda: np.lib.format.read_magic(member), path)  # noqa: B023 (called at once)
            if version not in _NPY_HEADERS:
                raise UsageError(f"{path}: {info.filename} is a .npy of format {version}; expected 1.0 or 2.0")
            shape, _, dtype = _library(lambda: _NPY_HEADERS[version](member), path)  # noqa: B023
        check_real_float(dtype, str(path), key)
        if any(n < 0 for n in shape):
            raise UsageError(f"{path}: {key!r} declares the shape {list(shape)}; expected sizes >= 0")
        declared[key] = (tuple(shape), dtype)
    return declared


def _library(call, path: Path):
    """``call()``, NumPy's own errors on a malformed member (a header that is not one) as one line."""
    try:
        return call()
    except (ValueError, SyntaxError, RecursionError, MemoryError, OSError, EOFError) as e:
        raise UsageError(f"{path}: not an archive of .npy arrays NumPy reads without pickle ({one_line(e)})") from None


def _read_safetensors(found: Found) -> dict[str, np.ndarray]:
    state = found.archive  # sized by the file (safetensors holds no strided views), no code
    check_tensor_kinds(state, found.where)
    return {k: (v.float() if v.dtype == torch.bfloat16 else v).numpy() for k, v in state.items()}


def build(arrays: dict[str, np.ndarray], where: str, device: str | None = None) -> CatFormer:
    """The CatFormer whose sizes the arrays give, loaded with them (float32 as theirs, float64 kept)."""
    W = arrays["W"]
    A = [arrays[f"A.{i}"] for i in range(sum(k.startswith("A.") for k in arrays))]
    if W.ndim != 2 or any(a.ndim != 3 or a.shape[1] != a.shape[2] for a in A):
        raise UsageError(
            f"{where}: W must be [d_L, d] and each A.i [heads, d_i, d_i]; got W {W.shape}, A {[a.shape for a in A]}"
        )
    d, T = W.shape[1], A[0].shape[1] - W.shape[1]
    cfg = CatFormerConfig(d_vocab=d, n_ctx=T, heads=[a.shape[0] for a in A], device=device or "cpu")
    if T < 1:
        raise UsageError(f"{where}: A.0 is {A[0].shape[1]} wide, not d + T with d = {d} (W's columns) and T >= 1")
    widths = cfg.widths()
    got, want = [a.shape[1] for a in A] + [W.shape[0]], widths
    if got != want:
        raise UsageError(
            f"{where}: widths {got} disagree with d_(i+1) = d_i (1 + heads_i) from d_0 = {widths[0]}: {want}"
        )
    model = CatFormer(cfg)
    dtype = torch.float64 if W.dtype == np.float64 else torch.float32
    state = {f"blocks.{i}.attn.A": torch.from_numpy(np.asarray(a, dtype=np.float64)) for i, a in enumerate(A)}
    state["W"] = torch.from_numpy(np.asarray(W, dtype=np.float64))
    if not all(torch.isfinite(t).all() for t in state.values()):
        raise UsageError(f"{where}: the weights hold NaN or Inf")
    model.load_state_dict(state)
    return model.to(dtype).to(cfg.device).eval()


def read(found: Found, device: str | None = None, *, weights: bool = True) -> Source:
    if found.path.suffix.lower() in PICKLES:
        refuse_pickle(found.path)
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
        raise UsageError(
            f"{found.where}: a CatFormer of T = {model.cfg.n_ctx} positions and {model.cfg.d_vocab} tokens reads "
            f"contexts of T + 1 = {model.cfg.n_ctx + 1} tokens; the task has {layout.n_positions} of {layout.min_vocab}"
        )
    return Source(model, task, layout, found.where, found.digest(), NAME, trained_on="last")  # their read-out's
