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


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.Adam([{"params": ps[:2], "lr": 1e-2}, {"params": ps[2:], "lr": 3e-2}], foreach=True),
    lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, foreach=True),
], ids=["Adam, two groups (models.train)", "AdamW, weight decay (models.standard)"])  # fmt: skip
def test_the_foreach_update_is_the_per_tensor_loop_bit_for_bit(make):
    """The trainers ask for torch's foreach Adam (one call for all tensors; the per-tensor loop is what torch
    picks on CPU): 200 steps of each give the same weights, bit for bit."""

    def train(foreach: bool) -> torch.Tensor:
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 3))
        opt = make(list(net.parameters()))
        for group in opt.param_groups:
            group["foreach"] = foreach
        g = torch.Generator().manual_seed(1)
        for _ in range(200):
            x, y = torch.randn(64, 8, generator=g), torch.randn(64, 3, generator=g)
            opt.zero_grad()
            (net(x) - y).pow(2).mean().backward()
            opt.step()
        return torch.cat([p.flatten() for p in net.parameters()])

    torch.manual_seed(0)
    start = torch.cat([p.flatten() for p in torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Linear(32, 3)).parameters()])
    looped, fused = train(False), train(True)
    assert torch.equal(looped, fused) and (looped - start).abs().max() > 1e-2  # equal, and trained
