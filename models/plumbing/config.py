"""Configs: frozen dataclasses whose fields are checked where they are made and are each a command-line flag.

A config subclasses ``Config`` (it becomes a frozen dataclass by itself) and declares each field with ``option``:
its default, its help sentence, and what it accepts beyond its type (choices, a range). Making one checks every
field by its annotation (``int``, ``float``, ``str``, ``bool``, ``X | None``, ``tuple[X, ...]``): an int refuses
2.5 and True, a float NaN, a string a number; then ``validate`` checks the rules between fields. Errors are a
``TypeError`` or ``ValueError`` whose message begins with the field's name (the command line names its flag
there). ``Config.flags`` gives the command line that makes the same config. Imports no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import dataclass_transform

MAX_CONTEXTS = 10**7  # n_contexts and the like: work grows with the count even where batches bound the memory


def option(default, help: str, *, choices=None, minimum=None, maximum=None, flag: str | None = None,
           metavar: str | None = None, sep: str | None = None, same_numbers: bool = False):  # fmt: skip
    """A config field that is also a flag: its default, its ``--help`` sentence, and what it accepts beyond its
    type (``choices``; ``minimum``/``maximum`` for a number; for a tuple, ``sep`` splits one flag value,
    ``"0,2,5"``, else the flag takes several values). ``flag``: the flag's name where it is not the field's.
    ``same_numbers``: the field changes where the work is kept, not what is computed (``Config.flags`` leaves it
    out of the command that remakes a result)."""
    meta = {"help": help, "choices": choices, "minimum": minimum, "maximum": maximum, "flag": flag,
            "metavar": metavar, "sep": sep, "same_numbers": same_numbers}  # fmt: skip
    return field(default=default, metadata=meta)


def flag_of(f) -> str:
    """The command-line flag of a config field: ``--`` and its ``flag`` metadata, else its name, dashed."""
    return "--" + (f.metadata.get("flag") or f.name).replace("_", "-")


def n_contexts(default: int, what: str = "contexts to sample", minimum: int = 1):
    """The ``n_contexts`` field most configs have: at least ``minimum``, at most ``MAX_CONTEXTS``."""
    return option(default, what, minimum=minimum, maximum=MAX_CONTEXTS)


MAX_SEED = 2**63 - 1  # probes.tasks.MAX_SEED (torch generators take 64-bit seeds), spelled here: that module loads torch
KINDS = {"int": int, "float": float, "str": str, "bool": bool}


def field_kind(f) -> tuple[type, bool, bool]:
    """A config field's annotation read as (element type, may be None, is a tuple): ``int``, ``float | None``,
    ``tuple[str, ...]``. Configs use only these, so that each maps to one flag."""
    text = f.type if isinstance(f.type, str) else f.type.__name__ if isinstance(f.type, type) else str(f.type)
    optional = text.endswith(" | None")
    text = text.removesuffix(" | None")
    many = text.startswith("tuple[")
    if many:
        text = text.removeprefix("tuple[").removesuffix(", ...]")
    if text not in KINDS:
        raise TypeError(f"config field {f.name}: type {f.type!r} is not one of int, float, str, bool, "
                        "X | None or tuple[X, ...]")  # fmt: skip
    return KINDS[text], optional, many


def checked(value, kind: type, name: str, meta) -> object:
    """``value`` if it is of ``kind`` and in the field's range and choices (an int is taken as a float); else a
    ``TypeError`` or ``ValueError`` naming the field, the value and what is expected."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        expected = {int: "an integer", float: "a number", str: "a string", bool: "True or False"}[kind]
        raise TypeError(f"{name} must be {expected}, got {value!r} ({type(value).__name__})")
    if kind is float and not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    low, high = meta.get("minimum"), meta.get("maximum")
    if low is not None and value < low or high is not None and value > high:
        bounds = f"in [{low}, {high}]" if low is not None and high is not None else f">= {low}" if low is not None else f"<= {high}"
        raise ValueError(f"{name} must be {bounds}, got {value!r}")
    if meta.get("choices") is not None and value not in meta["choices"]:
        raise ValueError(f"{name} must be one of {', '.join(map(str, meta['choices']))}; got {value!r}")
    return value


@dataclass_transform(frozen_default=True, field_specifiers=(option, n_contexts, field))
@dataclass(frozen=True)
class Config:
    """What every config has: the seed. A subclass is a frozen dataclass by itself (no decorator):
    change a config with ``dataclasses.replace(config, n_contexts=512)``. Each field is checked where the
    config is made (its type, range and choices: a ``TypeError`` or ``ValueError`` naming the field), then
    ``validate`` (rules between fields)."""

    seed: int = option(0, "seed of everything random", minimum=0, maximum=MAX_SEED)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        dataclass(frozen=True)(cls)

    def __post_init__(self):
        for f in fields(self):
            kind, optional, many = field_kind(f)
            value = getattr(self, f.name)
            if value is None and optional:
                continue
            if many:
                if isinstance(value, str) or not isinstance(value, (tuple, list)):
                    raise TypeError(f"{f.name} must be a tuple of {kind.__name__}, got {value!r}")
                value = tuple(checked(v, kind, f.name, f.metadata) for v in value)
            else:
                value = checked(value, kind, f.name, f.metadata)
            object.__setattr__(self, f.name, value)
        self.validate()

    def validate(self) -> None:
        """Rules between fields: a ``ValueError`` naming the first field it concerns."""

    def flags(self) -> list[str]:
        """The command-line flags that make this config's numbers: one per field that differs from its default
        (but those that only say where work is kept)."""
        argv = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value == f.default or f.metadata.get("same_numbers"):
                continue
            flag = flag_of(f)
            kind, _, many = field_kind(f)
            if kind is bool:
                argv.append(flag if value else "--no-" + flag[2:])
            elif many:
                values = [str(v) for v in value]
                argv += [flag, f.metadata["sep"].join(values) or "none"] if f.metadata.get("sep") else [flag, *values]
            else:
                argv += [flag, str(value)]
        return argv
