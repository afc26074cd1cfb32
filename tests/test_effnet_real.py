"""EfficientNet-Lite0 with its real ImageNet weights, on real images (Fashion-MNIST, foolbox's ImageNet samples)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mr2probe.datasets import build_dataset
from mr2probe.encoders import build_encoder
from mr2probe.extract import ExtractConfig, extract
from mr2probe.featurestore import read_features

pytestmark = pytest.mark.slow  # make test-all; make test leaves these out


def foolbox_data() -> Path:
    spec = importlib.util.find_spec("foolbox")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("foolbox (pip install --no-deps foolbox) not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def test_extract_20_real_fashion_mnist_images(tmp_path: Path) -> None:
    outs = []
    for name in ("a", "b"):
        cfg = ExtractConfig("efficientnet-lite0", "fashion-mnist", tmp_path / f"{name}.h5", per_class=1,
                            batch_size=8, workers=0, splits=("train", "test"), progress=False)
        outs.append(read_features(extract(cfg)))
    fs = outs[0]
    x = fs.splits["train"].features
    assert x.shape == (10, 1280) and fs.splits["test"].features.shape == (10, 1280)
    assert np.isfinite(x).all() and x.std() > 0
    assert sorted(fs.splits["train"].labels.tolist()) == list(range(10))
    for s in ("train", "test"):  # deterministic: a second extraction is identical
        np.testing.assert_array_equal(fs.splits[s].features, outs[1].splits[s].features)
    assert fs.attrs["weights_sha256"].startswith("579344248a93")


def test_imagenet_head_top5_on_real_imagenet_samples() -> None:
    from mr2probe.encoders.efficientnet_lite import build_network

    net, _ = build_network("efficientnet-lite0", None)
    enc = build_encoder("efficientnet-lite0")
    files = sorted(foolbox_data().glob("imagenet_*.jpg"))
    assert len(files) == 20
    batch = torch.stack([enc.transform(Image.open(f).convert("RGB")) for f in files])
    labels = torch.tensor([int(f.stem.rsplit("_", 1)[1]) for f in files])
    with torch.inference_mode():
        top5 = net(batch).topk(5).indices
    hits = (top5 == labels[:, None]).any(1).sum().item()
    assert hits >= 15, f"true label in top-5 for only {hits}/20 real ImageNet images"


def test_fashion_mnist_images_are_real() -> None:
    ds = build_dataset("fashion-mnist")
    assert len(ds.splits["train"]) == 60000 and len(ds.splits["test"]) == 10000
    assert ds.class_names[9] == "Ankle boot"
    assert ds.splits["test"].image(0).size == (28, 28)
