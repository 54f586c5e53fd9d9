"""What every trainer shares: the learning-rate schedule (linear warm-up, then cosine decay to a floor), the
training batch, the stop on divergence, and the memory a training process keeps."""

from __future__ import annotations

import ctypes
import math
import platform

import torch

from models.plumbing.io import UsageError


def cosine_factor(step: int, total: int, final_fraction: float = 0.0, warmup: int = 0) -> float:
    """Multiplier of the base learning rate at ``step`` (0-based) of ``total``: ``(step + 1) / warmup``
    during warm-up, then ``final + (1 - final) (1 + cos(pi t)) / 2`` with t from 0 to 1 over the rest."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min((step - warmup) / max(total - warmup, 1), 1.0)
    return final_fraction + (1 - final_fraction) * 0.5 * (1 + math.cos(math.pi * progress))


def check_finite(model, loss: float, step: int) -> None:
    """Training diverged (a NaN or Inf loss or weight): stop before writing a checkpoint that cannot load."""
    bad = [name for name, p in model.named_parameters() if not torch.isfinite(p).all()]
    if bad or not math.isfinite(loss):
        where = f"weights {', '.join(bad)}" if bad else f"loss {loss}"
        raise UsageError(f"training diverged at step {step} ({where} not finite); lower --lr")


def sample_batch(task, batch: int, generator: torch.Generator) -> torch.Tensor:
    """A training batch of ``task``'s contexts, ``[batch, T]``, drawn on one thread: the sampler is a loop of
    small operations over positions that several threads slow down (at the large preset, 2 threads took 5x
    as long as 1 on a shared machine), and the draws do not depend on the thread count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return task.sample(batch, generator)[0]
    finally:
        torch.set_num_threads(threads)


M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's mallopt parameters (malloc.h)


def keep_freed_memory() -> bool:
    """Keep what this process frees for its next allocations, as a training process (the same large buffers
    freed and asked for again every step) wants: by default glibc maps every block above 32 MB afresh and the
    kernel zero-fills each of its pages again (at the large preset 300 MB a step; ``python -m bench --only large``).
    Large blocks then come from the heap, which is trimmed only when 2 GB lie free at its top, so the process's
    memory stays near its peak. Returns whether it applied (glibc's mallopt; elsewhere nothing changes)."""
    if platform.libc_ver()[0] != "glibc":
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, 2**31 - 1) == 1
