"""The docs' generated reference pages cover the code: every training setting, every CLI command and flag, every
registered method (docs/gen_reference.py, regenerated here in a temp dir); and, marked slow, the strict build."""
from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _gen():
    spec = importlib.util.spec_from_file_location("mr2probe_docs_gen_reference", DOCS / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def unmd(text: str) -> str:
    """Generated markdown back to plain text: escapes and entities undone, whitespace collapsed."""
    text = re.sub(r"\\(.)", r"\1", text).replace("&lt;", "<").replace("&gt;", ">")
    return " ".join(text.split())


def start(help_text: str) -> str:
    """The first 40 characters of a help text, whitespace collapsed."""
    return " ".join(help_text.split())[:40]


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    gen = _gen()
    out = tmp_path_factory.mktemp("docs")
    written = gen.write_pages(out)
    assert {p.relative_to(out).as_posix() for p in written} == set(gen.PAGES)
    return {p.relative_to(out).as_posix(): p.read_text(encoding="utf-8") for p in written}


def test_settings_page_has_every_setting(pages):
    from mr2probe.settings import TRAIN

    text = pages["reference/settings.md"]
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| `")}
    for name, s in TRAIN.items():
        row = rows.get(f"`{name}`")
        assert row is not None, f"setting {name} missing from the settings reference"
        assert f"`{s.flag}`" in row and f"| {s.kind}" in row, f"{name}: flag or kind missing"
        assert start(s.help) in unmd(row), f"{name}: help missing"


def test_cli_page_has_every_command_and_flag(pages):
    import typer.main

    from mr2probe.cli import app

    text = pages["reference/cli.md"]
    group = typer.main.get_command(app)
    assert group.commands, "no commands found"
    for name, cmd in group.commands.items():
        if cmd.hidden:
            continue
        assert f"## `mr2probe {name}`" in text, f"command {name} missing from the CLI reference"
        section = text.split(f"## `mr2probe {name}`", 1)[1].split("\n## ", 1)[0]
        for p in cmd.params:
            if getattr(p, "hidden", False):
                continue
            if p.param_type_name == "argument":
                assert f"`{p.name.upper()}" in section, f"{name}: argument {p.name} missing"
            else:
                for opt in [*p.opts, *p.secondary_opts]:
                    assert f"`{opt}`" in section, f"{name}: flag {opt} missing"
            if getattr(p, "help", None):
                assert start(p.help) in unmd(section), f"{name} {p.name}: help missing"


def test_methods_page_has_every_method(pages):
    from mr2probe.methods import METHODS
    from mr2probe.probes import PROBES

    text = pages["reference/methods.md"]
    for name in METHODS.names():
        assert f"### `{name}`" in text, f"method {name} missing from the methods reference"
        cls = METHODS.get(name)
        section = text.split(f"### `{name}`", 1)[1].split("\n### ", 1)[0]
        for key in cls.defaults:
            assert f"`{key}`" in section, f"{name}: hyperparameter {key} missing"
        if cls.__doc__:
            first = cls.__doc__.strip().splitlines()[0].strip()
            assert first in section, f"{name}: docstring missing"
    for name in PROBES.names():
        assert f"### `{name}`" in text, f"exact probe {name} missing"


def test_every_nav_page_exists_and_hand_pages_speak_of_the_software():
    nav = re.findall(r":\s*([\w/-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), flags=re.M)
    generated = set(_gen().PAGES)
    assert generated <= set(nav)
    for page in nav:
        assert page in generated or (DOCS / page).is_file(), f"nav names a missing page: {page}"
    # words of development history (spelled with classes, so this file does not match itself)
    history = re.compile(r"\bs[e]ssions?\b|this r[o]und|the i[s]sue|team d[e]cision", re.I)
    for path in [*DOCS.glob("*.md"), ROOT / "README.md"]:
        if path.exists():
            hits = [line for line in path.read_text(encoding="utf-8").splitlines() if history.search(line)]
            assert not hits, f"{path.name} speaks of development history: {hits[:3]}"


def _slug(heading: str) -> str:
    """The anchor mkdocs' toc extension gives a heading (its default slugify: markup dropped, lower case, words
    joined by '-')."""
    text = re.sub(r"[`*_\[\]]", "", heading)
    text = re.sub(r"[^\w\s-]", "", text, flags=re.U).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def test_readme_is_short_starts_with_the_setup_and_links_to_existing_pages():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300, "README.md is longer than 300 lines"
    commands = [line.split("#")[0].strip() for line in text.splitlines() if line.startswith("make ")]
    assert commands[:2] == ["make demo", "make test"], commands
    assert 'readme = "README.md"' in (ROOT / "pyproject.toml").read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        assert (ROOT / path).exists(), f"README.md links to a missing file: {target}"
        if anchor:
            headings = [line.lstrip("#").strip() for line in (ROOT / path).read_text(encoding="utf-8").splitlines()
                        if line.startswith("#")]
            assert anchor in {_slug(h) for h in headings}, f"README.md links to a missing anchor: {target}"


@pytest.mark.slow
def test_strict_build(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs / mkdocs-material not installed (make docs installs them)")
    mkdocs = [sys.executable, "-m", "mkdocs"]
    result = subprocess.run([*mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    for page in ("reference/cli", "reference/settings", "reference/methods", "findings"):
        assert (tmp_path / "site" / page / "index.html").is_file()
    shutil.rmtree(tmp_path / "site", ignore_errors=True)
