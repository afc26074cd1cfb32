"""Registries by name: every encoder, dataset, method and head is registered once and found by name.

A name is either exact (``"efficientnet-lite0"``) or a family prefix ending in ``":"``
(``"clip:"`` matches ``"clip:ViT-B-16/openai"``); the text after the colon is the family's argument.

A registry may require a base type: registering anything else is a ``TypeError`` (methods: ``Method``
subclasses, encoders: ``EncoderSpec`` subclasses, datasets: ``DatasetSpec`` subclasses). A class registered under
a name gets that name as its ``name`` class attribute. A :class:`Spec` entry is built through one signature,
``REGISTRY.create(name, **options)`` = ``spec.build(spec.Options(arg=<text after the family prefix>, **options))``.

Third-party packages add entries through Python entry points: a registry made with ``group="mr2probe.encoders"``
loads, once and only when first asked for a name, every entry point of that group and registers the object it
points at under the entry point's name, e.g. in the plugin's ``pyproject.toml``::

    [project.entry-points."mr2probe.encoders"]
    my-encoder = "my_package.encoders:MyEncoder"

A plugin that fails to load (import error, wrong type, a name taken) is skipped with one ``warning:`` line on
stderr; the built-in entries keep working.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Callable, ClassVar, Generic, TypeVar

from .errors import UserError

T = TypeVar("T")


@dataclass(frozen=True)
class Options:
    """What every build takes: ``arg``, the text after a family prefix (``""`` for an exact name)."""

    arg: str = ""


class Spec:
    """A registry entry that builds an object: ``build(options)`` with ``options`` an instance of ``Options``."""

    name: ClassVar[str] = ""  # set by the registry when the class is registered
    Options: ClassVar[type[Options]] = Options

    @classmethod
    def build(cls, options: Any) -> Any:
        """The object this entry stands for, built with ``options`` (an instance of ``cls.Options``)."""
        raise NotImplementedError(f"{cls.__name__} does not define build(options)")


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0][:200]}" if text else type(err).__name__


class Registry(Generic[T]):
    """A name → object table with a helpful error for unknown names.

    ``base``: the type every entry must be (a class entry: a subclass of it). ``group``: the entry-point group
    whose plugins are loaded on first use."""

    def __init__(self, kind: str, base: type | None = None, group: str | None = None) -> None:
        self.kind, self.base, self.group = kind, base, group
        self._items: dict[str, T] = {}
        self._help: dict[str, str] = {}
        self._plugins_loaded = group is None

    def register(self, name: str, help: str = "") -> Callable[[T], T]:
        """Decorator: ``@REG.register("name")`` stores the object under ``name`` (and sets a class's ``name``)."""

        def deco(obj: T) -> T:
            self._check(name, obj)
            if isinstance(obj, type):
                obj.name = name  # type: ignore[attr-defined]
            self._items[name] = obj
            doc = help or (getattr(obj, "__doc__", None) or "").strip().splitlines()
            self._help[name] = doc if isinstance(doc, str) else (doc[0] if doc else "")
            return obj

        return deco

    def _check(self, name: str, obj: Any) -> None:
        """TypeError for an entry of the wrong type or a class already named otherwise; ValueError for a taken name."""
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} registered twice")
        if self.base is not None:
            ok = issubclass(obj, self.base) if isinstance(obj, type) else isinstance(obj, self.base)
            if not ok:
                raise TypeError(f"{self.kind} {name!r} must be a subclass of {self.base.__name__}, got {obj!r}")
        own = vars(obj).get("name") if isinstance(obj, type) else None
        if own and own != name:
            raise TypeError(f"{self.kind} {name!r}: {obj.__name__} is already registered as {own!r}")

    def load_plugins(self) -> None:
        """Register every entry point of ``group`` once; a broken one is skipped with one warning line."""
        if self._plugins_loaded:
            return
        self._plugins_loaded = True  # first: a plugin that imports this registry does not load the group again
        for ep in metadata.entry_points(group=self.group):
            try:
                obj = ep.load()
                if self._items.get(ep.name) is not obj:  # a plugin module may register itself on import
                    self.register(ep.name)(obj)
            except Exception as e:  # noqa: BLE001 - whatever a third-party module raises, it must not stop us
                print(f"warning: skipped {self.kind} plugin {ep.name!r} ({ep.value}): {_first_line(e)}",
                      file=sys.stderr)

    def lookup(self, name: str) -> tuple[T, str]:
        """Return ``(object, argument)``; argument is the text after a family prefix, else ``""``."""
        self.load_plugins()
        if name in self._items:
            return self._items[name], ""
        if ":" in name:
            prefix, arg = name.split(":", 1)
            if prefix + ":" in self._items:
                return self._items[prefix + ":"], arg
        raise UserError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")

    def get(self, name: str) -> T:
        return self.lookup(name)[0]

    def create(self, name: str, **options: Any) -> Any:
        """Build entry ``name`` (a :class:`Spec`): ``spec.build(spec.Options(arg=…, **options))``."""
        spec, arg = self.lookup(name)
        if not (isinstance(spec, type) and issubclass(spec, Spec)):
            raise TypeError(f"{self.kind} {name!r} is not a Spec; it has no build(options)")
        return spec.build(spec.Options(arg=arg, **options))

    def names(self) -> list[str]:
        self.load_plugins()
        return sorted(self._items)

    def describe(self) -> dict[str, str]:
        return {n: self._help[n] for n in self.names()}

    def __contains__(self, name: str) -> bool:
        try:
            self.lookup(name)
            return True
        except UserError:
            return False
