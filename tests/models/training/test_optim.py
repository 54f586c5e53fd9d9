"""models.training.optim: the training batch does not depend on the thread count, and a training process keeps the
memory it frees (a large block asked for again faults in no fresh pages)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest
import torch

from models.training.optim import sample_batch
from models.training.train import PRESETS, TrainConfig

FAULTS = """
import resource, sys, torch
import models.training.train  # what a training process has loaded (its heap's small blocks are placed already)
from models.training.optim import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(8):  # 64 MB: allocated, filled, freed, eight times
    before = faults()
    torch.ones(2**24)
    print(faults() - before)
"""


def test_the_batch_is_the_same_on_one_thread_as_on_several():
    task = TrainConfig(**PRESETS["medium"]).task()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        several = task.sample(32, torch.Generator().manual_seed(5))[0]
        one = sample_batch(task, 32, torch.Generator().manual_seed(5))
        assert torch.get_num_threads() == 2  # restored
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, several)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_freed_memory_is_reused_without_faulting_in_fresh_pages():
    """Each in a fresh interpreter (mallopt is for the whole process): by default glibc maps a 64 MB block
    afresh every time (16384 pages of 4 KB faulted in again); with the memory kept, it reuses freed ones."""
    faulted = {}
    for which in ("default", "keep"):
        run = subprocess.run([sys.executable, "-c", FAULTS, which], capture_output=True, text=True, check=True)
        faulted[which] = [int(n) for n in run.stdout.split()]
    pages = 2**24 * 4 // 4096
    assert min(faulted["default"]) > pages // 2, faulted
    # Kept: the heap settles within a few blocks (an aligned block needs a little more room than a freed one).
    assert sum(faulted["keep"][4:]) < pages // 20, faulted
