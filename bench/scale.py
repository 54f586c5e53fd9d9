"""``python -m bench --only scale``: an analysis on a GPT-2-small-shaped model (``GPT2Config(n_layer=12, n_head=12,
n_embd=768)``: the 50,257-token vocabulary, random weights, ``save_pretrained``, the shipped standard model's
task.json beside it) beside the same analysis on the shipped 2-layer GPT-2, in one run: each analysis with its
default flags (``--threads 1`` unless ``--threads`` says otherwise), in a fresh process, timed by wall clock and
by the CPU time and peak resident memory of that process (``os.wait4``), with the load average before and after
(the machine may be shared). ``--quick``: the 4-layer stand-in of the tests (8 heads, width 64, 1,000 tokens).

A new row is one line of ``ANALYSES``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from models.loading.named import STANDARD_CHECKPOINT

GPT2_SMALL = {"n_layer": 12, "n_head": 12, "n_embd": 768}  # GPT2Config's other defaults: vocab 50257, 1024 positions
STAND_IN = {"n_layer": 4, "n_head": 8, "n_embd": 64, "vocab_size": 1000}
# (row name, the analysis's module). The circuit on this shape is bench's own row, ``circuit-scale``
# (bench.rows.circuit_scale_row: discover at small sizes, the default run taking far longer than a benchmark should)
ANALYSES = [("inspect", "analyses.inspect")]
ROOT = Path(__file__).resolve().parent.parent


def gpt2_folder(folder: Path, shape: dict, seed: int = 0) -> Path:
    """A Hugging Face GPT-2 of ``shape`` (``GPT2Config`` fields) with random weights drawn from ``seed``, saved
    into ``folder`` with the shipped standard model's task.json."""
    import torch
    import transformers

    torch.manual_seed(seed)
    special = {} if shape.get("vocab_size", 50257) > 50256 else {"bos_token_id": 0, "eos_token_id": 0}  # in range
    cfg = transformers.GPT2Config(**shape, **special, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    transformers.logging.disable_progress_bar()
    transformers.GPT2LMHeadModel(cfg).save_pretrained(folder)
    shutil.copy(STANDARD_CHECKPOINT / "task.json", folder / "task.json")
    return folder


def timed_run(argv: list[str], out: Path) -> dict:
    """``python -m <argv>`` in a fresh process from the repository root: its wall time, CPU time (user + system),
    peak resident memory (bytes), the load average before and after, its exit code and its last line of output
    (stdout and stderr to ``out``.log)."""
    load = os.getloadavg()[0]
    with open(out.with_suffix(".log"), "w") as log:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", *argv], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    lines = out.with_suffix(".log").read_text(errors="replace").strip().splitlines()
    return {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss": usage.ru_maxrss * 1024,  # Linux: kilobytes
        "load": (load, os.getloadavg()[0]),
        "exit": proc.returncode,
        "last_line": lines[-1] if lines else "",
    }


def _words(run: dict) -> str:
    if run["exit"] != 0:
        return f"FAILED (exit {run['exit']}: {run['last_line'][:200]})"
    return (f"{run['wall_s']:.0f} s wall, {run['cpu_s']:.0f} s CPU, peak RSS {run['peak_rss'] / 2**30:.2f} GB, "
            f"load {run['load'][0]:.1f} -> {run['load'][1]:.1f}")  # fmt: skip


def scale_rows(device: str = "cpu", threads: int | None = None, quick: bool = False) -> list[dict]:
    """One row per entry of ``ANALYSES`` (the module docstring): ours = the GPT-2-small shape, baseline = the
    shipped GPT-2, ratio = how many times as long (wall)."""
    shape = STAND_IN if quick else GPT2_SMALL
    what = ", ".join(f"{k} {v}" for k, v in shape.items()) + ("" if "vocab_size" in shape else ", vocab_size 50257")
    flags = ["--threads", str(threads or 1), *(["--device", device] if device != "cpu" else [])]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = gpt2_folder(Path(tmp) / "gpt2", shape)
        for name, module in ANALYSES:
            runs = {}
            for label, checkpoint in (("shipped", "standard"), ("big", str(folder))):
                out = Path(tmp) / f"{name}_{label}"
                runs[label] = timed_run([module, "--checkpoint", checkpoint, "--out", str(out), *flags], out)
            big, shipped = runs["big"], runs["shipped"]
            ok = big["exit"] == 0 and shipped["exit"] == 0
            rows.append({
                "row": f"{name}, GPT-2 of {what}, random weights, default flags {' '.join(flags)}",
                "ours_s": big["wall_s"] if ok else None,
                "baseline_s": shipped["wall_s"] if ok else None,
                "baseline": "the same on the shipped 2-layer GPT-2 (ratio: times as long)",
                "ratio": big["wall_s"] / shipped["wall_s"] if ok else None,
                "note": f"GPT-2: {_words(big)}; shipped: {_words(shipped)}",
                "runs": json.loads(json.dumps(runs)),
            })  # fmt: skip
    return rows
