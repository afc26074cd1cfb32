"""Test-only support for tests/test_extract_engine.py (not collected: the name does not start with test_).

Registers a tiny deterministic encoder (two seeded convs at 32 px, float64 inside so results do not depend on
batch composition or thread count), and doubles as a CLI driver that has it registered, for subprocesses:

    python tests/_extract_support.py extract --encoder test-engine-tinyconv ...
    torchrun --nproc_per_node=2 tests/_extract_support.py extract ...
"""
from __future__ import annotations

import torch

from mr2probe.encoders import ENCODERS, EncoderConfig, EncoderOptions, EncoderSpec, TorchEncoder

NAME = "test-engine-tinyconv"
DIM = 16


class TinyConv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(1234)
        self.w1 = torch.nn.Parameter(torch.randn(8, 3, 3, 3, generator=g, dtype=torch.float64) * 0.3)
        self.w2 = torch.nn.Parameter(torch.randn(DIM, 8, 3, 3, generator=g, dtype=torch.float64) * 0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.double()
        x = torch.relu(torch.nn.functional.conv2d(x, self.w1, stride=2, padding=1))
        x = torch.tanh(torch.nn.functional.conv2d(x, self.w2, stride=2, padding=1))
        return x.mean(dim=(2, 3)).float()


class TinyConvSpec(EncoderSpec):
    """test only: tiny seeded conv net, 16-d, 32 px"""

    config = EncoderConfig(dim=DIM, input_size=(3, 32, 32), crop_pct=1.0, mean=(0.5,) * 3, std=(0.5,) * 3)

    @classmethod
    def build(cls, options: EncoderOptions) -> TorchEncoder:
        return TorchEncoder(NAME, TinyConv(), cls.config, weights_sha256="0" * 64)


if NAME not in ENCODERS:
    ENCODERS.register(NAME)(TinyConvSpec)


if __name__ == "__main__":
    from mr2probe.cli import main

    main()
