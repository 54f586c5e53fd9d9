"""The one table of floating-point dtypes: which a weight may be stored in, which a model runs in."""

from __future__ import annotations

import torch

# Every dtype a stored weight may have; the disentangled model runs in any of them (``model.half()``, ...).
DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}
# What ``--dtype`` converts to, training runs in, and ``models.nets.hooked_transformer`` computes in.
RUN_DTYPES = ("float32", "float64")


def dtype_name(value) -> str | None:
    """The table's name of ``value`` ("float32", "torch.float32" or ``torch.float32``); None if it has none."""
    if isinstance(value, torch.dtype):
        return next((name for name, t in DTYPES.items() if t == value), None)
    name = str(value).removeprefix("torch.")
    return name if name in DTYPES else None
