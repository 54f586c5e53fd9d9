"""A registry of named objects (as auto-circuit's ``PruneAlgo`` registry): corruptions, score methods and
searches are each one registration, found by their name wherever a name is read."""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar


class Named(Protocol):
    name: str


T = TypeVar("T", bound=Named)


class Registry(dict, Generic[T]):
    """``{name: object}`` in registration order. ``register(obj)`` adds one (a name registered twice is
    refused); ``registry[name]`` of an unknown name is a one-line ``ValueError`` naming the known ones."""

    def __init__(self, what: str):
        super().__init__()
        self.what = what

    def register(self, item: T) -> T:
        """Add ``item`` under ``item.name``; returns it (usable as a decorator's result)."""
        if item.name in self:
            raise ValueError(f"a {self.what} named {item.name!r} is registered already")
        self[item.name] = item
        return item

    def __missing__(self, name: str):
        raise ValueError(f"unknown {self.what} {name!r}; expected one of {', '.join(self)}")
