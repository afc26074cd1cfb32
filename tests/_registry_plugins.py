"""Test-only third-party plugins for tests/test_registry.py (not collected: the name does not start with test_).

The tests point fake entry points (``importlib.metadata.EntryPoint``) at the objects here, as an installed
distribution's ``[project.entry-points."mr2probe.*"]`` table would.
"""
from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from mr2probe.datasets import DatasetOptions, DatasetSpec, ImageDataset, ImageSplit
from mr2probe.encoders import Encoder, EncoderConfig, EncoderOptions, EncoderSpec, TorchEncoder
from mr2probe.methods import Method


class PluginMethod(Method):
    """plugin method: plain CE under another name"""


class PluginEncoder(EncoderSpec):
    """plugin encoder: global mean of each channel, 3-d, 8 px"""

    config = EncoderConfig(dim=3, input_size=(3, 8, 8), crop_pct=1.0, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))

    @classmethod
    def build(cls, options: EncoderOptions) -> Encoder:
        return TorchEncoder(cls.name, _ChannelMean(), cls.config)


class _ChannelMean(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


class PluginDataset(DatasetSpec):
    """plugin dataset: 2 classes of flat grey 8x8 images, 4 train / 2 test"""

    @classmethod
    def build(cls, options: DatasetOptions) -> ImageDataset:
        def split(n: int) -> ImageSplit:
            return ImageSplit(np.arange(n) % 2, lambda i: Image.new("RGB", (8, 8), (60 * (i % 2),) * 3))

        return ImageDataset(cls.name, ["dark", "light"], {"train": split(4), "test": split(2)})


class NotASpec:
    """not an entry of any registry"""
