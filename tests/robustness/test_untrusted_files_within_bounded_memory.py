"""The fifth robustness catalogue (issue 41), memory: a weight file is read without running code or touching
memory it did not allocate, and every size it declares (a pickle's arrays, a .npz member's .npy header, a
config's ``block_size``, a stride-0 tensor's shape, a key map's padding) is checked before it is allocated.

Each case runs ``python -m models.evaluate --checkpoint FILE`` in a process of its own (forked from a server that
has done the imports, ``tests/helpers/forked.py``) through ``tests/helpers/peak_rss.py``, which measures how far
the command raised the process's peak resident memory (``resource.getrusage``). The process is the point: a
crash (SIGSEGV) and a peak are properties of a process. Each case must exit 2 with ONE line on stderr that
names the file and what was refused, and must raise the peak by less than ``MAX_GROWTH``, against the GBs the
file declares. The address space is limited (``LIMIT_BYTES``) so that a regression fails here instead of
taking the machine's memory."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
import zipfile
from pathlib import Path

import forked
import numpy as np
import pytest
import torch
from test_formats_pipelines import PaperLiteral, paper_key_map, small_task, write_paper_literal

from probes.graph_task import make_task

ROOT = Path(__file__).resolve().parents[2]
EDELMAN = ROOT / "tests" / "models" / "loading" / "data" / "edelman"
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
LIMIT_BYTES = 12 * 10**9  # room for each case's old failure to show as a peak (3.3 GB), not as a refusal
MAX_GROWTH = 256 * 2**20  # bytes: what refusing may take, against the 1 to 80 GB the files declare
D, T = 3, 20  # the CatFormer's vocabulary and positions (A.0 is [1, 23, 23])


def evaluate(path: Path, *extra: str, cwd: Path) -> tuple[forked.Completed, int]:
    """``python -m models.evaluate --checkpoint path extra`` in a forked process: (what it did, peak growth in bytes)."""
    peak = cwd / "peak_kib.txt"
    argv = ("models.evaluate", "--checkpoint", str(path), "--n-contexts", "8", "--batch-size", "8", *extra)
    proc = forked.run("peak_rss", str(peak), *argv, cwd=cwd, env=ENV, limit=LIMIT_BYTES)
    return proc, int(peak.read_text()) * 1024 if peak.is_file() else -1


def refused_within_bounded_memory(proc: forked.Completed, growth: int, *expected: str) -> None:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert 0 <= growth < MAX_GROWTH, f"the run raised the peak resident memory by {growth / 2**20:.0f} MiB: {lines}"
    assert len(lines) == 1, lines
    for text in expected:
        assert text in lines[0], lines[0]


# --- pickles: refused unread, whatever they hold ---------------------------------------------------------------
class _Dtype:
    """Pickles as ``numpy.dtype("V8")`` whose ``__setstate__`` receives ``state``: the state a file chooses."""

    def __init__(self, state: tuple):
        self.state = state

    def __reduce__(self):
        return np.dtype, ("V8", False, True), self.state


class _Array:
    """Pickles as NumPy pickles an array: ``_reconstruct(ndarray, shape, dtype)``, then, given ``data``,
    ``__setstate__((1, shape, dtype, False, data))``; without ``data``, the uninitialised array itself."""

    def __init__(self, shape: tuple, dtype, data: bytes | None = None):
        self.shape, self.dtype, self.data = shape, dtype, data

    def __reduce__(self):
        rebuild = np._core.multiarray._reconstruct
        if self.data is None:
            return rebuild, (np.ndarray, self.shape, self.dtype)
        return rebuild, (np.ndarray, (0,), b"b"), (1, self.shape, self.dtype, False, self.data)


def _evil_dtype_pickle() -> bytes:
    """A CatFormer pytree whose arrays have a dtype of one float64 field placed 4 KB past each 8-byte item
    (NumPy then reads weights from memory it did not allocate), and flags that mark it as holding objects
    (NumPy then dereferences pointers the file wrote). Names only the globals a pickle of arrays names."""
    far = _Dtype((3, "|", None, ("w",), {"w": (np.dtype("<f8"), 4096)}, 8, 1, 0))
    pointers = _Dtype((3, "|", None, ("w",), {"w": (np.dtype("<f8"), 0)}, 8, 1, 1 | 8 | 16))
    A0 = _Array((1, D + T, D + T), far, bytes(8 * (D + T) ** 2))
    A1 = _Array((1, 2 * (D + T), 2 * (D + T)), pointers, b"\x41" * 8 * (2 * (D + T)) ** 2)
    return pickle.dumps({"A": [A0, A1], "W": np.zeros((4 * (D + T), D))}, protocol=4)


def _deep_key_pickle(depth: int = 10**6) -> bytes:
    """{((...(1,)...),): 2}, a dict whose key is a tuple nested ``depth`` deep (about 2 bytes a level):
    hashing it recurses once per level."""
    return b"\x80\x02}" + b"(" * depth + b"K\x01" + b"t" * depth + b"K\x02s."


def _huge_reconstruct_pickle() -> bytes:
    """A pickle of about 1 KB whose one-layer CatFormer has A.0 [1, n, n] with n^2 = 2.5e8 float64 (2 GB),
    rebuilt by ``_reconstruct`` uninitialised, with a W of the widths that fit it: every size consistent."""
    n = 15_812  # n^2 = 2.5e8
    A0, W = _Array((1, n, n), np.dtype("<f8")), _Array((2 * n, D), np.dtype("<f8"))
    return pickle.dumps({"A": [A0], "W": W}, protocol=4)


PICKLES = {
    "a dtype of evil offsets and flags": _evil_dtype_pickle,
    "a key nested a million deep": _deep_key_pickle,
    "_reconstruct of 2.5e8 elements": _huge_reconstruct_pickle,
}


@pytest.fixture(scope="module")
def catformer_folder(tmp_path_factory) -> Path:
    """A folder with a task.json a CatFormer of T = 20 positions reads (so that only the weights can fail)."""
    folder = tmp_path_factory.mktemp("catformer")
    task = make_task("nichani_dag:index=0:kernel=dirichlet", D, 0, T + 1, alpha=0.1)
    (folder / "task.json").write_text(json.dumps(task.to_dict()))
    return folder


@pytest.mark.parametrize("suffix", [".pkl", ".npz"])
@pytest.mark.parametrize("case", list(PICKLES))
def test_a_crafted_pickle_is_refused_unread_in_one_line(catformer_folder, tmp_path, case, suffix):
    """Named .pkl, the file is refused by its suffix, unread, with the line that exports the pytree as .npz;
    named .npz, it is not a zip archive and is refused as such. No crash, no memory."""
    path = catformer_folder / f"{case.replace(' ', '_')}{suffix}"
    path.write_bytes(PICKLES[case]())
    proc, growth = evaluate(path, cwd=tmp_path)
    expected = "is a pickle: CatFormer weights are read from a .npz" if suffix == ".pkl" else "is not a .npz archive"
    refused_within_bounded_memory(proc, growth, str(path), expected)


# --- sizes declared, checked before anything is read or built ------------------------------------------------
def write_npz_declaring(path: Path, members: dict[str, tuple[tuple[int, ...], str]], compression: int) -> None:
    """A .npz whose members hold zeros of the given (shape, dtype), written as a stream (the zeros compress
    to a few MB however many GB they declare)."""
    chunk = bytes(2**24)
    with zipfile.ZipFile(path, "w", compression=compression, compresslevel=1) as archive:
        for name, (shape, dtype) in members.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                header = {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": shape}
                np.lib.format.write_array_header_1_0(member, header)
                left = int(np.prod(shape)) * np.dtype(dtype).itemsize
                while left > 0:
                    member.write(chunk[: min(left, len(chunk))])
                    left -= len(chunk)


def test_a_npz_whose_headers_declare_over_a_gigabyte_is_refused_from_its_headers(catformer_folder, tmp_path):
    """A 5 MB deflate .npz whose W declares 144e6 float64 (1.15 GB): refused from the .npy headers, before a
    byte of data is decompressed (the limit applies to what the headers declare, not to the file's size)."""
    path = catformer_folder / "declares_1gb.npz"
    width = 4 * (D + T)
    members = {"A.0": ((1, D + T, D + T), "<f4"), "A.1": ((1, 2 * (D + T), 2 * (D + T)), "<f4")}
    write_npz_declaring(path, {**members, "W": ((width, 144 * 10**6 // width), "<f8")}, zipfile.ZIP_DEFLATED)
    assert path.stat().st_size < 8 * 2**20
    proc, growth = evaluate(path, cwd=tmp_path)
    refused_within_bounded_memory(
        proc, growth, str(path), "its arrays declare 1.2 GB", "'W'", "expected at most 268.4 MB"
    )


@pytest.fixture(scope="module")
def edelman_checkpoint(tmp_path_factory) -> Path:
    """Edelman et al.'s checkpoint as their code writes it (block_size 50), task.json and config.json beside."""
    sys.path.insert(0, str(EDELMAN))
    try:
        from mingpt.model_rpe import Relative_Transformer
        from mingpt.utils import CfgNode
    finally:
        sys.path.remove(str(EDELMAN))
    folder = tmp_path_factory.mktemp("edelman")
    cfg = CfgNode(n_layer=2, n_head=1, n_embd=16, vocab_size=3, block_size=50, embd_pdrop=0.0, resid_pdrop=0.0,
                  attn_pdrop=0.0, causal=True, abs_embd=False, attention_only=True, device="cpu")  # fmt: skip
    torch.save(Relative_Transformer(cfg).state_dict(), folder / "model.pt")
    (folder / "config.json").write_text(json.dumps(cfg.to_dict()))
    task = make_task("chain:kernel=dirichlet", 3, 0, 50, alpha=1.0)
    (folder / "task.json").write_text(json.dumps(task.to_dict()))
    return folder / "model.pt"


def test_an_edelman_config_with_block_size_100000_is_refused_before_the_model_is_built(edelman_checkpoint, tmp_path):
    """block_size b gives each layer a b x b position index: b = 100 000 is 80 GB a layer, sized on the meta
    device before anything is built."""
    folder = tmp_path / "edelman"
    shutil.copytree(edelman_checkpoint.parent, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "block_size": 100_000}))
    proc, growth = evaluate(folder / "model.pt", cwd=tmp_path)
    refused_within_bounded_memory(
        proc, growth, str(folder / "model.pt"), "the model its config describes would need about 160."
    )


def test_a_stride_0_mask_of_60000_squared_is_sized_as_what_it_becomes(edelman_checkpoint, tmp_path):
    """A .pt of 72 KB whose causal mask is one stored float expanded (stride 0) to [1, 1, 60000, 60000]: sized as
    the 14.4 GB it becomes once copied, from its shape, before it is compared or copied."""
    folder = tmp_path / "edelman"
    shutil.copytree(edelman_checkpoint.parent, folder)
    state = torch.load(folder / "model.pt", weights_only=True)
    state["layers.0.bias"] = torch.ones(1, 1, 1, 1).expand(1, 1, 60_000, 60_000)
    torch.save(state, folder / "model.pt")
    assert (folder / "model.pt").stat().st_size < 128 * 2**10  # the whole model, the mask included
    proc, growth = evaluate(folder / "model.pt", cwd=tmp_path)
    refused_within_bounded_memory(
        proc, growth, str(folder / "model.pt"), "'layers.0.bias' [1, 1, 60000, 60000], holds 4 B in the file"
    )


def test_a_key_map_padding_a_tensor_to_3_gb_is_refused_before_padding(tmp_path):
    """A key map whose pad would make w_L [K, 2.5e8] (3 GB of float32), within the memory available: its
    result's shape is found on the meta device and refused against the model's, before anything is padded."""
    task = small_task()
    path, _ = write_paper_literal(tmp_path / "paper", task, PaperLiteral(task.d_vocab, task.n_examples, task.seq_len))
    rows = torch.load(path, weights_only=True)["w_L"].shape[0]
    key_map = paper_key_map(task.d_vocab)
    key_map["w_L"]["pad"]["after"] = 3 * 10**9 // (4 * rows)
    (tmp_path / "pad_map.json").write_text(json.dumps(key_map))
    proc, growth = evaluate(path, "--key-map", str(tmp_path / "pad_map.json"), cwd=tmp_path)
    refused_within_bounded_memory(proc, growth, "key map entry 'w_L'")
