"""Key maps (``key_map=`` / ``--key-map map.json``): names in a state dict (after prefix stripping) ->
our names, each optionally transformed, in this order: ``transpose`` (two dims; ``true`` means the last
two), ``reshape``, ``pad`` (``dim``, ``before``/``after`` counts, constant ``value``), ``place`` (into a
zero tensor of ``shape``, default the expected shape of ``to``, with its first element at ``at``).
The reserved key ``default`` gives constants for tensors the file lacks, filled to the expected shape.
Keys the map does not name keep their name. The paper-literal parameterisation (docs/paper.md section 3
taken literally: ``w^L`` with L entries, ``W_KQ`` Kd x Kd over the copies only, ``W_OV`` d x d from the
token only, no root bias), with d = 5, L = K = 10, maps exactly onto ``CausalTransformer`` by::

    {"w_H":  "blocks.0.attn.w_H",
     "w_L":  {"to": "blocks.0.attn.w_L", "pad": {"dim": 1, "after": 1, "value": -1e4}},
     "W_KQ": {"to": "blocks.1.attn.W_KQ", "place": {"at": [5, 5]}},
     "W_OV": {"to": "blocks.1.attn.W_OV", "place": {"at": [0, 0]}},
     "default": {"b_root": 0.0}}

(``w_L``'s extra entry is the target's own prefix: -1e4 gives it weight exp(-1e4) = 0 exactly, so the
copyers' softmax runs over the demonstrations only; ``W_KQ`` fills the copy-copy block of the
((K+1)d)^2 matrix, ``W_OV`` the token rows of the (K+1)d x d one; a zero root bias is a uniform prior.)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from models.plumbing.io import UsageError, check_memory, listing, read_json, tensor_bytes

DEFAULTS = "default"  # reserved key-map key: constants for tensors the file lacks
ENTRY_FIELDS = ("to", "transpose", "reshape", "pad", "place")


def read_key_map(key_map) -> dict[str, dict]:
    """Validate a key map (a dict or a JSON path) into ``{source: {to, transpose, reshape, pad, place}}``
    plus ``{"default": {our key: constant}}`` (see the module docstring)."""
    if key_map is None:
        return {}
    raw = key_map if isinstance(key_map, dict) else read_json(key_map, "key map")
    if not isinstance(raw, dict):
        raise UsageError(
            f"key map must be a JSON object {{file key: our key or {{to, transpose, reshape, pad, place}}}}, "
            f"got {type(raw).__name__}"
        )
    spec: dict[str, dict] = {}
    for src, entry in raw.items():
        if src == DEFAULTS:
            spec[DEFAULTS] = _read_defaults(entry)
            continue
        entry = {"to": entry} if isinstance(entry, str) else entry
        if not isinstance(entry, dict) or not isinstance(entry.get("to"), str):
            raise UsageError(f"key map entry {src!r} must be a key name or an object with a 'to' name")
        unknown = set(entry) - set(ENTRY_FIELDS)
        if unknown:
            raise UsageError(
                f"key map entry {src!r} has unknown fields {sorted(unknown)}; expected {', '.join(ENTRY_FIELDS)}"
            )
        t = entry.get("transpose", False)
        if not (isinstance(t, bool) or (isinstance(t, list) and len(t) == 2 and all(_is_int(i) for i in t))):
            raise UsageError(f"key map entry {src!r}: transpose must be true/false or two dims, got {t!r}")
        r = entry.get("reshape")
        if r is not None and not _int_list(r):
            raise UsageError(f"key map entry {src!r}: reshape must be a list of ints, got {r!r}")
        spec[src] = {
            "to": entry["to"],
            "transpose": t,
            "reshape": r,
            "pad": _read_pad(src, entry.get("pad")),
            "place": _read_place(src, entry.get("place")),
        }
    return spec


def _read_pad(src: str, pad) -> dict | None:
    if pad is None:
        return None
    usage = 'pad must be {"dim": int, "before": int >= 0, "after": int >= 0, "value": number}'
    if not isinstance(pad, dict) or set(pad) - {"dim", "before", "after", "value"} or not _is_int(pad.get("dim")):
        raise UsageError(f"key map entry {src!r}: {usage}, got {pad!r}")
    before, after, value = pad.get("before", 0), pad.get("after", 0), pad.get("value", 0.0)
    if not (_is_int(before) and _is_int(after) and before >= 0 and after >= 0) or not _is_number(value):
        raise UsageError(f"key map entry {src!r}: {usage}, got {pad!r}")
    return {"dim": pad["dim"], "before": before, "after": after, "value": float(value)}


def _read_place(src: str, place) -> dict | None:
    if place is None:
        return None
    usage = 'place must be {"at": [ints >= 0], "shape": [ints] (optional: the expected shape)}'
    if not isinstance(place, dict) or set(place) - {"at", "shape"} or not _int_list(place.get("at")):
        raise UsageError(f"key map entry {src!r}: {usage}, got {place!r}")
    shape = place.get("shape")
    if any(i < 0 for i in place["at"]) or (shape is not None and not _int_list(shape)):
        raise UsageError(f"key map entry {src!r}: {usage}, got {place!r}")
    return {"at": list(place["at"]), "shape": None if shape is None else list(shape)}


def _read_defaults(entry) -> dict[str, float]:
    if not isinstance(entry, dict) or not all(isinstance(k, str) and _is_number(v) for k, v in entry.items()):
        raise UsageError(f'key map "default" must be {{our key: number}} for tensors the file lacks, got {entry!r}')
    return {k: float(v) for k, v in entry.items()}


def apply_key_map(
    state: dict[str, Tensor], spec: dict[str, dict], expected: dict[str, tuple[int, ...]] | None = None
) -> dict[str, Tensor]:
    """Rename and transform as ``spec`` says (every key it names must be in ``state``), then fill the
    ``default`` tensors the result lacks. ``expected``: our names -> shapes, for ``place`` and defaults; each
    transform is first run on the meta device, and a result whose shape is not the expected one is refused
    before anything is padded or placed."""
    expected = expected or {}
    defaults = spec.get(DEFAULTS, {})
    entries = {k: v for k, v in spec.items() if k != DEFAULTS}
    absent = sorted(set(entries) - set(state))
    if absent:
        raise UsageError(f"key map names {listing(absent)}, not in the file (it has {listing(sorted(state))})")
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        entry = entries.get(key)
        if entry is not None:
            want = expected.get(entry["to"])
            planned = _transform(key, value.to("meta"), entry, want)  # the shape it will have: nothing allocated
            if want is not None and tuple(planned.shape) != tuple(want):
                raise UsageError(
                    f"key map entry {key!r} makes {entry['to']!r} of shape {list(planned.shape)} from "
                    f"{list(value.shape)}; the model's {entry['to']!r} is {list(want)}"
                )
            value = _transform(key, value, entry, want)
            key = entry["to"]
        if key in out:
            raise UsageError(f"key map sends two tensors to {key!r}")
        out[key] = value
    for key, value in defaults.items():
        if key in out:
            continue
        if key not in expected:
            raise UsageError(
                f"key map default {key!r} is not a tensor of the model; expected one of {', '.join(expected)}"
            )
        dtype = next((v.dtype for v in out.values() if v.is_floating_point()), torch.float32)
        check_fits_dtype(value, dtype, f"key map default {key!r}")
        out[key] = torch.full(expected[key], value, dtype=dtype)
    return out


def _transform(key: str, value: Tensor, entry: dict, expected: tuple[int, ...] | None) -> Tensor:
    t, r, pad, place = entry["transpose"], entry["reshape"], entry["pad"], entry["place"]
    if t is not False:
        dims = (-2, -1) if t is True else tuple(t)
        if value.ndim < 2 or not all(-value.ndim <= i < value.ndim for i in dims):
            raise UsageError(f"key map cannot transpose {key!r} of shape {tuple(value.shape)} over dims {dims}")
        value = value.transpose(*dims)
    if r is not None:
        try:
            value = value.reshape(r)
        except RuntimeError:
            raise UsageError(f"key map cannot reshape {key!r} of shape {tuple(value.shape)} to {r}") from None
    if pad is not None:
        dim = pad["dim"]
        if not -value.ndim <= dim < value.ndim:
            raise UsageError(f"key map cannot pad {key!r} of shape {tuple(value.shape)} along dim {dim}")
        widths = [0, 0] * (value.ndim - 1 - dim % value.ndim) + [pad["before"], pad["after"]]
        padded = list(value.shape)
        padded[dim] += pad["before"] + pad["after"]
        check_memory(tensor_bytes(padded, value.element_size()), f"key map entry {key!r}: pad to shape {padded}")
        check_fits_dtype(pad["value"], value.dtype, f"key map entry {key!r}: pad value")
        value = F.pad(value, widths, value=pad["value"])  # F.pad lists dims from the last
    if place is not None:
        shape = place["shape"] or (list(expected) if expected is not None else None)
        if shape is None:
            raise UsageError(
                f"key map entry {key!r}: place needs a shape (the target {entry['to']!r} is not a model tensor)"
            )
        at = place["at"]
        if (
            len(at) != value.ndim
            or len(shape) != value.ndim
            or any(a + n > s for a, n, s in zip(at, value.shape, shape))
        ):
            raise UsageError(
                f"key map cannot place {key!r} of shape {tuple(value.shape)} at {at} in a tensor of shape {list(shape)}"
            )
        what = f"key map entry {key!r}: place into shape {list(shape)}"
        check_memory(tensor_bytes(shape, value.element_size()), what)
        block = value.new_zeros(shape)
        block[tuple(slice(a, a + n) for a, n in zip(at, value.shape))] = value
        value = block
    return value.contiguous()


def check_fits_dtype(value: float, dtype: torch.dtype, what: str) -> None:
    """A constant the key map writes into a tensor of ``dtype``: a float dtype whose range holds it."""
    name = str(dtype).replace("torch.", "")
    if not dtype.is_floating_point:
        raise UsageError(f"{what} {value!r} would go into a tensor of dtype {name}; expected float weights")
    if abs(value) > torch.finfo(dtype).max:
        raise UsageError(
            f"{what} {value!r} is beyond the {name} range of the tensor it fills (max {torch.finfo(dtype).max:.3g})"
        )


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _int_list(x) -> bool:
    return isinstance(x, list) and all(_is_int(i) for i in x)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
