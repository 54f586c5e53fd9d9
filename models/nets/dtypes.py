"""The one table of floating-point dtypes: which a weight may be stored in, which a model runs in. Names only,
so that reading the table (``--dtype``'s choices) loads no torch; ``torch_dtype`` gives the torch dtype."""

from __future__ import annotations

# Every dtype a stored weight may have; the disentangled model runs in any of them (``model.half()``, ...).
DTYPES = ("float32", "float64", "float16", "bfloat16")
# What ``--dtype`` converts to, training runs in, and ``models.nets.hooked_transformer`` computes in.
RUN_DTYPES = ("float32", "float64")


def torch_dtype(name: str):
    """The ``torch.dtype`` of a name of the table ("float32" -> ``torch.float32``)."""
    import torch

    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    return getattr(torch, name)


def dtype_name(value) -> str | None:
    """The table's name of ``value`` ("float32", "torch.float32" or ``torch.float32``); None if it has none."""
    name = str(value).removeprefix("torch.")
    return name if name in DTYPES else None
