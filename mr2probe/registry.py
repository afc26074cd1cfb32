"""Registries by name: every encoder, dataset, method and head is registered once and found by name.

A name is either exact (``"efficientnet-lite0"``) or a family prefix ending in ``":"``
(``"clip:"`` matches ``"clip:ViT-B-16/openai"``); the builder of a family receives the text after the colon.
"""
from __future__ import annotations

from typing import Callable, Generic, TypeVar

from .errors import UserError

T = TypeVar("T")


class Registry(Generic[T]):
    """A name → object table with a helpful error for unknown names."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._help: dict[str, str] = {}

    def register(self, name: str, help: str = "") -> Callable[[T], T]:
        """Decorator: ``@REG.register("name")`` stores the object under ``name``."""

        def deco(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._items[name] = obj
            doc = help or (getattr(obj, "__doc__", None) or "").strip().splitlines()
            self._help[name] = doc if isinstance(doc, str) else (doc[0] if doc else "")
            return obj

        return deco

    def lookup(self, name: str) -> tuple[T, str]:
        """Return ``(object, argument)``; argument is the text after a family prefix, else ``""``."""
        if name in self._items:
            return self._items[name], ""
        if ":" in name:
            prefix, arg = name.split(":", 1)
            if prefix + ":" in self._items:
                return self._items[prefix + ":"], arg
        raise UserError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")

    def get(self, name: str) -> T:
        return self.lookup(name)[0]

    def names(self) -> list[str]:
        return sorted(self._items)

    def describe(self) -> dict[str, str]:
        return {n: self._help[n] for n in self.names()}

    def __contains__(self, name: str) -> bool:
        try:
            self.lookup(name)
            return True
        except UserError:
            return False
