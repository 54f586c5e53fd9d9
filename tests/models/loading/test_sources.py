"""models.loading.sources: one read of each file. ``python -m analyses.inspect --checkpoint standard`` opens the
checkpoint's task.json exactly once (counted at ``open``, below every reader), and a whole pickled
``nn.Module`` is refused by its own format with the line that says what to save instead."""

from __future__ import annotations

import builtins
import io
import os

import pytest
import torch
from torch import nn

import models
from analyses import inspect
from models.loading.sources import FORMATS, pickled_module, resolve


def test_inspect_on_standard_reads_task_json_once(tmp_path, monkeypatch):
    opened = []
    real_open, real_io_open, real_os_open = builtins.open, io.open, os.open
    task_json = os.path.realpath(models.STANDARD_CHECKPOINT / "task.json")

    def counted(real):
        def wrapper(file, *args, **kwargs):
            if isinstance(file, (str, os.PathLike)) and os.path.realpath(file) == task_json:
                opened.append(real.__name__)
            return real(file, *args, **kwargs)

        return wrapper

    monkeypatch.setattr(builtins, "open", counted(real_open))
    monkeypatch.setattr(io, "open", counted(real_io_open))
    monkeypatch.setattr(os, "open", counted(real_os_open))
    inspect.main(["--checkpoint", "standard", "--out", str(tmp_path), "--n-contexts", "64"])
    assert len(opened) == 1, opened


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3, 2)


@pytest.mark.parametrize("protocol", [2, 4])
def test_a_pickled_module_is_refused_saying_what_to_save(tmp_path, protocol):
    path = tmp_path / "model.pt"
    torch.save(Net(), path, pickle_protocol=protocol)
    with pytest.raises(ValueError) as e:
        resolve(path)
    line = str(e.value)
    assert "\n" not in line and "torch.save(model.state_dict()" in line and f"{__name__}.Net" in line


def test_state_dicts_are_not_taken_for_pickled_modules(tmp_path):
    torch.save(Net().state_dict(), tmp_path / "w.pt")
    torch.save({"_parameters": 1, "_buffers": 2, "_modules": 3}, tmp_path / "d.pt")
    assert pickled_module.pickled_class(tmp_path / "w.pt") is None
    assert pickled_module.pickled_class(tmp_path / "d.pt") is None
    assert FORMATS.index(pickled_module) < len(FORMATS) - 2  # tried before the catch-all weight-file format
