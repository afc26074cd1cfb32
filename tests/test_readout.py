"""ViT token readouts (``extract --pool cls|avg|cls+avg --blocks N``), offline on random-weight timm and open_clip
ViTs: sizes from the configuration, the parts' layout (the last part is the one-block readout, cls differs from avg),
the default output kept, the ONNX runtime, provenance, the default file name and resume identity, and bad
combinations as one error line with exit code 2."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import pytest
import torch
from typer.testing import CliRunner

from mr2probe.cli import app
from mr2probe.encoders import build_encoder, cpu_runtime
from mr2probe.errors import UserError
from mr2probe.extract import ExtractConfig, extract
from mr2probe.featurestore import read_features

TIMM = "timm:vit_tiny_patch16_224@random"
# name → (width C of one part, recorded readout keys besides pool and blocks)
FAMILIES = {TIMM: (192, {"norm": "norm"}),
            "clip:ViT-S-32-alt/random": (256, {"norm": "ln_post", "projection": "after"}),
            "clip:ViT-S-32-alt/random@preproj": (384, {"norm": "ln_post", "projection": "before"})}


def _x(n: int = 2) -> torch.Tensor:
    return torch.randn(n, 3, 224, 224, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name", list(FAMILIES))
def test_readout_sizes_and_parts(name: str) -> None:
    width, recorded = FAMILIES[name]
    x = _x()
    own = build_encoder(name).encode(x)
    feats = {}
    for pool in ("cls", "avg", "cls+avg"):
        for blocks in (1, 2):
            enc = build_encoder(name, pool=pool, blocks=blocks)
            assert enc.dim == width * blocks * (2 if pool == "cls+avg" else 1)
            assert enc.readout == {"pool": pool, "blocks": blocks, **recorded}
            feats[pool, blocks] = f = enc.encode(x)
            assert f.shape == (2, enc.dim) and torch.isfinite(f).all()
    torch.testing.assert_close(feats["cls", 1], own)  # one block's class token is the encoder's own output
    assert (feats["cls", 1] - feats["avg", 1]).abs().max() > 1e-3
    for pool in ("cls", "avg", "cls+avg"):  # blocks are concatenated oldest first: the last part is blocks=1
        one = feats[pool, 1]
        torch.testing.assert_close(feats[pool, 2][:, -one.shape[1]:], one)
        assert (feats[pool, 2][:, :one.shape[1]] - one).abs().max() > 1e-3  # the earlier block differs
    parts = torch.cat([feats["cls", 2][:, :width], feats["avg", 2][:, :width],
                       feats["cls", 2][:, width:], feats["avg", 2][:, width:]], dim=1)
    torch.testing.assert_close(feats["cls+avg", 2], parts)  # per block: [cls, avg]


def test_avg_is_the_mean_of_normed_patch_tokens() -> None:
    model = build_encoder(TIMM).module
    x = _x()
    tokens = model.forward_features(x)  # the last block's tokens through the final norm
    for pool, want in (("avg", tokens[:, model.num_prefix_tokens:].mean(1)), ("cls", tokens[:, 0])):
        torch.testing.assert_close(build_encoder(TIMM, pool=pool).encode(x), want)


def test_onnx_runtime_keeps_the_readout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv("MR2PROBE_CACHE", str(tmp_path))
    x = _x()
    one, two = build_encoder(TIMM, pool="cls+avg"), build_encoder(TIMM, pool="cls+avg", blocks=2)
    onnx_one, onnx_two = cpu_runtime(one, "onnx"), cpu_runtime(two, "onnx")
    assert len(list((tmp_path / "onnx").glob("*.onnx"))) == 2  # the readout is part of the export's cache key
    assert (onnx_two.dim, onnx_two.readout) == (two.dim, two.readout)
    for torch_enc, onnx_enc in ((one, onnx_one), (two, onnx_two)):
        ref = torch_enc.encode(x)
        assert float((onnx_enc.encode(x) - ref).norm() / ref.norm()) < 1e-4


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An imagefolder tree of foolbox's sample images: train/ and test/ with two classes."""
    from test_encoders import _sample_dir

    src = sorted(_sample_dir().glob("imagenet_*.jpg"))[:8]
    root = tmp_path_factory.mktemp("imgs")
    for i, path in enumerate(src):
        folder = root / ("train" if i % 4 < 3 else "test") / f"c{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, folder / path.name)
    return root


def _cfg(root: Path, out: Path, **kw) -> ExtractConfig:
    return ExtractConfig(encoder=TIMM, dataset="imagefolder", root=root, out=out, workers=0, batch_size=4,
                         runtime="torch", progress=False, dtype="float32", **kw)


def test_extract_records_the_readout(images: Path, tmp_path: Path) -> None:
    out = extract(_cfg(images, tmp_path / "a.h5", pool="cls+avg", blocks=2))
    assert read_features(out).attrs["encoder"] == TIMM
    with h5py.File(out) as f:
        assert json.loads(f.attrs["readout"]) == {"pool": "cls+avg", "blocks": 2, "norm": "norm"}
        assert f["train/features"].shape[1] == 4 * 192
    plain = extract(_cfg(images, tmp_path / "b.h5"))
    with h5py.File(plain) as f:
        assert "readout" not in f.attrs and f["train/features"].shape[1] == 192
    with pytest.raises(UserError, match="readout"):  # a finished file of another readout is not kept silently
        extract(_cfg(images, out, pool="avg"))


def test_a_partial_resumes_only_under_its_readout(images: Path, tmp_path: Path) -> None:
    from mr2probe.featurestore import FeatureWriter, base_attrs, partial_path

    out = tmp_path / "p.h5"
    attrs = base_attrs(TIMM, "imagefolder", ["c0", "c1"], {})
    attrs["readout"] = json.dumps({"pool": "avg", "blocks": 1, "norm": "norm"}, sort_keys=True)
    FeatureWriter(out, attrs, 192).close()
    assert partial_path(out).exists()
    with pytest.raises(UserError, match="readout"):
        extract(_cfg(images, out, pool="cls"))


def test_cli_default_name_and_bad_combinations(images: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    base = ["extract", "--dataset", "imagefolder", "--root", str(images), "--workers", "0", "--runtime", "torch",
            "-q"]
    r = runner.invoke(app, [*base, "--encoder", TIMM, "--pool", "cls+avg", "--blocks", "2"])
    assert r.exit_code == 0, r.output
    made = tmp_path / "features" / "imagefolder-timm_vit_tiny_patch16_224@random-clsavg-b2.h5"
    assert made.is_file() and f"wrote features/{made.name}" in r.output
    for flags, says in ((["--encoder", "timm:resnet18@random", "--blocks", "2"], "is not one"),
                        (["--encoder", "dinov2-s14", "--pool", "avg"], "is not one"),
                        (["--encoder", TIMM, "--pool", "max"], "--pool must be one of"),
                        (["--encoder", TIMM, "--blocks", "0"], "--blocks must be"),
                        (["--encoder", TIMM, "--blocks", "13"], "has 12 blocks"),
                        (["--encoder", "timm:vit_base_patch16_224.mae@random", "--pool", "cls", "--blocks", "99"],
                         "has 12 blocks")):
        r = runner.invoke(app, [*base, *flags, "--out", str(tmp_path / "bad.h5")])
        lines = [line for line in r.output.splitlines() if line.strip()]
        assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:") and says in lines[0], r.output


def test_recipe_with_a_readout() -> None:
    from mr2probe.encoders.readout import check_readout
    from mr2probe.recipes import load_recipe

    recipe = load_recipe(Path(__file__).resolve().parents[1] / "extract" / "dinov2-b14-linear4.toml")
    assert (recipe["encoder"], recipe["pool"], recipe["blocks"]) == ("dinov2_vitb14", "cls+avg", 4)
    check_readout(recipe["pool"], recipe["blocks"])
