"""mr2probe.registry: base types, names, one build signature, and third-party plugins through entry points."""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from importlib import metadata

import pytest

from PIL import Image

from mr2probe.errors import UserError
from mr2probe.methods import METHODS, Method
from mr2probe.registry import Options, Registry, Spec


class Shape(Spec):
    """a shape"""


@dataclass(frozen=True)
class ShapeOptions(Options):
    scale: float = 1.0


class Square(Shape):
    """a square: side arg (default 1), times scale"""

    Options = ShapeOptions

    @classmethod
    def build(cls, options: ShapeOptions) -> tuple[str, float]:
        return cls.name, float(options.arg or 1) * options.scale


def shapes() -> Registry:
    reg: Registry = Registry("shape", base=Shape)
    reg.register("square")(Square)
    reg.register("sq:")(type("SquareFamily", (Square,), {"__doc__": "squares by side"}))
    return reg


def test_registering_sets_the_class_name_and_builds_through_create() -> None:
    reg = shapes()
    assert Square.name == "square" and reg.get("sq:3").name == "sq:"
    assert reg.create("square") == ("square", 1.0)
    assert reg.create("sq:3", scale=2.0) == ("sq:", 6.0)
    assert reg.lookup("sq:3") == (reg.get("sq:"), "3")
    assert reg.describe() == {"sq:": "squares by side", "square": "a square: side arg (default 1), times scale"}


def test_registering_checks_the_base_type_and_the_name() -> None:
    reg = shapes()
    with pytest.raises(TypeError, match="must be a subclass of Shape"):
        reg.register("circle")(type("Circle", (), {}))
    with pytest.raises(TypeError, match="must be a subclass of Shape"):
        reg.register("fn")(lambda: None)
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("square")(type("Other", (Shape,), {}))
    with pytest.raises(TypeError, match="already registered as 'square'"):
        reg.register("box")(Square)
    with pytest.raises(UserError, match="unknown shape 'circle'; known: sq:, square"):
        reg.get("circle")
    assert "sq:1" in reg and "circle" not in reg


def test_create_refuses_an_entry_that_is_not_a_spec() -> None:
    reg: Registry = Registry("thing")
    reg.register("f")(lambda: 1)
    with pytest.raises(TypeError, match="not a Spec"):
        reg.create("f")


def test_every_method_is_a_method_subclass_named_by_the_registry() -> None:
    assert METHODS.base is Method and METHODS.group == "mr2probe.methods"
    for name in METHODS.names():
        cls = METHODS.get(name)
        assert issubclass(cls, Method) and cls.name == name


def package_registries() -> dict[str, Registry]:
    """Every Registry instance at the top level of a module of the package, by ``module.attribute`` where first
    found (``__main__`` is left out: importing it runs the command line)."""
    import mr2probe

    found: dict[int, tuple[str, Registry]] = {}
    for info in pkgutil.walk_packages(mr2probe.__path__, "mr2probe."):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue
        module = importlib.import_module(info.name)
        for attr, value in vars(module).items():
            if isinstance(value, Registry):
                found.setdefault(id(value), (f"{info.name}.{attr}", value))
    return dict(found.values())


def test_every_registry_of_the_package_declares_a_base_type_and_its_entries_have_it() -> None:
    regs = package_registries()
    kinds = {reg.kind for reg in regs.values()}
    assert {"method", "encoder", "dataset", "head", "adapter", "exact probe", "feature spec", "tracker"} <= kinds
    for where, reg in regs.items():
        assert isinstance(reg.base, type), f"{where} ({reg.kind}) declares no base type"
        assert reg.names(), f"{where} is empty"
        for name in reg.names():
            obj = reg.get(name)
            ok = issubclass(obj, reg.base) if isinstance(obj, type) else isinstance(obj, reg.base)
            assert ok, f"{where}: {name!r} is not a {reg.base.__name__}"


@pytest.mark.parametrize("wrong", [type("NotAnEntry", (), {}), object(), "text"], ids=["class", "object", "str"])
def test_every_registry_of_the_package_refuses_a_wrong_type_with_one_clear_error(wrong: object) -> None:
    for where, reg in package_registries().items():
        before = dict(reg._items)
        with pytest.raises(TypeError) as err:
            reg.register("not-an-entry")(wrong)
        message = str(err.value)
        assert message == f"{reg.kind} 'not-an-entry' must be a subclass of {reg.base.__name__}, got {wrong!r}", where
        assert "\n" not in message and reg._items == before, where


def test_heads_adapters_and_feature_specs_build_through_create() -> None:
    from mr2probe.heads import ADAPTERS, HEADS, CosineHead, Head, LinearHead, MLPAdapter, NoAdapter
    from mr2probe.synthetic import SPEC_FAMILIES, FeatureSpecFamily, Spec as FeatureSpec, parse_spec

    assert HEADS.base is Head and type(HEADS.create("cosine")) is CosineHead and type(HEADS.create("linear")) is \
        LinearHead
    assert type(ADAPTERS.create("mlp")) is MLPAdapter and type(ADAPTERS.create("none")) is NoAdapter
    assert HEADS.get("cosine").name == "cosine" and ADAPTERS.get("mlp").name == "mlp"
    assert SPEC_FAMILIES.base is FeatureSpecFamily and SPEC_FAMILIES.names() == ["spread:", "synthetic:"]
    built = SPEC_FAMILIES.create("synthetic:K=3,D=4,n=5")
    assert isinstance(built, FeatureSpec) and built.canonical == "synthetic:K=3,D=4,n=5,spread=1,sep=3,seed=0"
    assert parse_spec(" synthetic:K=3,D=4,n=5 ").file_name() == built.file_name()
    with pytest.raises(UserError, match="unknown feature spec 'gauss:K=3'"):
        parse_spec("gauss:K=3")


# ---------------------------------------------------------------- plugins through entry points


def fake_entry_points(monkeypatch: pytest.MonkeyPatch, group: str, **targets: str) -> list[str]:
    """Make ``importlib.metadata.entry_points(group=group)`` return entry points ``name = "module:attr"`` (as an
    installed distribution declaring them would); returns the list of groups asked for."""
    asked: list[str] = []
    eps = [metadata.EntryPoint(name, value, group) for name, value in targets.items()]

    def entry_points(**kw: str) -> list[metadata.EntryPoint]:
        asked.append(kw.get("group", ""))
        return eps if kw.get("group") == group else []

    monkeypatch.setattr(metadata, "entry_points", entry_points)
    return asked


def fresh(monkeypatch: pytest.MonkeyPatch, reg: Registry) -> None:
    """Let ``reg`` load its plugins again; undo whatever they register after the test."""
    monkeypatch.setattr(reg, "_plugins_loaded", False)
    monkeypatch.setattr(reg, "_items", dict(reg._items))
    monkeypatch.setattr(reg, "_help", dict(reg._help))


def test_a_plugin_is_loaded_lazily_once(monkeypatch: pytest.MonkeyPatch) -> None:
    reg: Registry = Registry("shape", base=Shape, group="test.shapes")
    asked = fake_entry_points(monkeypatch, "test.shapes", cube="test_registry:Square")
    assert asked == []  # nothing is loaded before a name is asked for
    monkeypatch.setattr(Square, "name", "")  # the module-level registry above named it already
    assert reg.names() == ["cube"] and reg.create("cube") == ("cube", 1.0)
    assert reg.describe() == {"cube": "a square: side arg (default 1), times scale"}
    assert asked == ["test.shapes"]  # once


def test_a_broken_plugin_is_one_warning_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    reg: Registry = Registry("shape", base=Shape, group="test.shapes")
    fake_entry_points(monkeypatch, "test.shapes", missing="no_such_module_xyz:Thing",
                      wrong="test_registry:ShapeOptions")
    assert reg.names() == []
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2
    assert err[0].startswith("warning: skipped shape plugin 'missing' (no_such_module_xyz:Thing): ModuleNotFoundError")
    assert err[1].startswith("warning: skipped shape plugin 'wrong' (test_registry:ShapeOptions): TypeError: shape "
                             "'wrong' must be a subclass of Shape")


def test_plugins_of_the_three_registries_are_listed_and_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """A distribution declaring ``[project.entry-points."mr2probe.encoders"]`` (datasets, methods alike)."""
    from mr2probe.datasets import DATASETS, build_dataset
    from mr2probe.encoders import ENCODERS, build_encoder

    for reg, group, target in ((ENCODERS, "mr2probe.encoders", "PluginEncoder"),
                               (DATASETS, "mr2probe.datasets", "PluginDataset"),
                               (METHODS, "mr2probe.methods", "PluginMethod")):
        with monkeypatch.context() as m:
            fresh(m, reg)
            before = set(reg._items)
            fake_entry_points(m, group, **{"plugin-x": f"_registry_plugins:{target}"})
            assert set(reg.names()) == before | {"plugin-x"}
            assert reg.get("plugin-x").name == "plugin-x" and reg.describe()["plugin-x"].startswith("plugin")
            if reg is ENCODERS:
                enc = build_encoder("plugin-x")
                x = enc.transform(Image.new("RGB", (12, 10), (255, 0, 51)))
                assert enc.dim == 3 and enc.preprocessing["crop"] == 8
                assert enc.encode(x[None])[0].tolist() == pytest.approx([1.0, -1.0, 51 / 127.5 - 1], abs=1e-6)
            elif reg is DATASETS:
                data = build_dataset("plugin-x")
                assert data.name == "plugin-x" and data.splits["train"].labels.tolist() == [0, 1, 0, 1]
            else:
                assert issubclass(reg.get("plugin-x"), Method)


def test_a_broken_plugin_leaves_the_built_in_entries(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture) -> None:
    from mr2probe.encoders import ENCODERS

    fresh(monkeypatch, ENCODERS)
    built_in = {n: ENCODERS._help[n] for n in ENCODERS._items}
    fake_entry_points(monkeypatch, "mr2probe.encoders", broken="_registry_broken_plugin:Encoder",
                      dataset="_registry_plugins:PluginDataset", plain="_registry_plugins:NotASpec")
    assert ENCODERS.describe() == built_in and "efficientnet-lite0" in ENCODERS
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("warning: skipped encoder plugin") for line in err)
    assert err[0].endswith("'broken' (_registry_broken_plugin:Encoder): RuntimeError: this plugin is broken")
    assert "'dataset' (_registry_plugins:PluginDataset): TypeError: encoder 'dataset' must be a subclass of " \
           "EncoderSpec" in err[1]
    assert "'plain' (_registry_plugins:NotASpec): TypeError" in err[2]
