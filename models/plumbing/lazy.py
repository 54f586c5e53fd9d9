"""Names a package defines without importing them (PEP 562): each is imported from its module on first use, so
that importing the package loads no torch, reads no argument and changes no environment variable."""

from __future__ import annotations

import importlib


def lazy_names(namespace: dict, table: dict[str, str]):
    """The ``__getattr__`` and ``__dir__`` of the package whose ``globals()`` is ``namespace``, for ``table``
    (``{name: the module that defines it}``): ``__getattr__, __dir__ = lazy_names(globals(), _PUBLIC)``."""
    package = namespace["__name__"]

    def __getattr__(name: str):
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(table[name]), name)
        namespace[name] = value  # the next look-up is a plain attribute
        return value

    def __dir__() -> list[str]:
        return sorted([*namespace, *table])

    return __getattr__, __dir__
