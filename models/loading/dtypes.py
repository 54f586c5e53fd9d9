"""The one check that a stored weight is a real float (``check_real_float``), which every format calls on every
tensor it reads, before converting it: a complex or integer tensor is refused by name, never cast. The table of
dtypes it checks against is ``models.nets.dtypes``."""

from __future__ import annotations

import numpy as np
import torch

from models.nets.dtypes import DTYPES, dtype_name
from models.plumbing.io import UsageError

# The dtype codes of a safetensors header (``safe_open(...).get_slice(k).get_dtype()``) for the table's dtypes.
SAFETENSORS_CODES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64"}
EXPECTED = "real float weights (float16, bfloat16, float32 or float64)"


def weight_dtype_name(value) -> str | None:
    """The table's name of a stored weight's dtype, given as a torch dtype, a NumPy dtype (either byte order),
    a safetensors header's code (``F32``, ``BF16``, ...) or a name; None for any other (complex, integer,
    bool, a NumPy structured or void dtype)."""
    if isinstance(value, np.dtype):
        return value.name if value.kind == "f" and value.name in DTYPES else None
    if isinstance(value, str) and value in SAFETENSORS_CODES:
        return SAFETENSORS_CODES[value]
    return dtype_name(value)


def shown(value) -> str:
    """A dtype as a message names it: ``complex64``, ``int64``, ``void16``, ``C64`` (a safetensors code)."""
    return value.name if isinstance(value, np.dtype) else str(value).removeprefix("torch.")


def check_real_float(value, where: str, tensor: str) -> None:
    """One ``UsageError`` naming the file (``where``), the tensor and its dtype if ``value`` (any form
    ``weight_dtype_name`` reads) is not one of the table's float dtypes."""
    if weight_dtype_name(value) is None:
        hint = ""
        if isinstance(value, np.dtype) and value.kind == "V" and value.itemsize == 2:
            hint = " (a bfloat16 array saved by NumPy keeps no name: save np.asarray(x, np.float32) instead)"
        raise UsageError(
            f"{where}: {tensor!r} is of dtype {shown(value)}{hint}; expected {EXPECTED} (complex and integer "
            "tensors are refused, not cast)"
        )


def check_tensor_kinds(state: dict, source: str) -> None:
    """Every value of ``state`` is a dense (strided), materialised, non-quantized tensor of a real float
    dtype (``check_real_float``); else one ``UsageError`` naming ``source``, the tensor and what it is."""
    for key, v in state.items():
        if not isinstance(v, torch.Tensor):
            raise UsageError(f"{source}: {key!r} is a {type(v).__name__}, not a tensor")
        kind = None
        if v.layout != torch.strided:
            kind = f"a {str(v.layout).replace('torch.', '')} tensor"
        elif v.is_meta:
            kind = "a meta tensor (no data)"
        elif v.is_quantized:
            kind = "a quantized tensor"
        if kind:
            raise UsageError(f"{source}: {key!r} is {kind}; expected dense float16/bfloat16/float32/float64 weights")
        check_real_float(v.dtype, source, key)
