"""Encoder registry: ``build_encoder("efficientnet-lite0")``, ``ENCODERS.names()``; one file per encoder family.

Third-party encoders join through the entry-point group ``mr2probe.encoders`` (see :mod:`mr2probe.registry`)."""
from __future__ import annotations

from pathlib import Path

from .. import plugins
from ._base import (ENCODERS, IMAGENET_MEAN, IMAGENET_STD, Encoder, EncoderConfig, EncoderOptions, EncoderSpec,
                    OnnxEncoder, TorchEncoder, build_transform, cpu_runtime, load_state_dict, sha256_file)
from .readout import POOLS, apply_readout, check_readout


def build_encoder(name: str, weights: str | Path | None = None, pool: str | None = None,
                  blocks: int | None = None) -> Encoder:
    """Build a registered encoder by name (exact, or ``family:arg``); ``weights`` overrides its weights; ``pool``
    / ``blocks`` set a ViT token readout (:mod:`.readout`; None: the encoder's own pooled output)."""
    check_readout(pool, blocks)
    encoder = ENCODERS.create(name, weights=Path(weights) if weights else None)
    return apply_readout(encoder, pool, blocks)


plugins.import_all(__import__(__name__, fromlist=["_"]))

__all__ = ["ENCODERS", "IMAGENET_MEAN", "IMAGENET_STD", "POOLS", "Encoder", "EncoderConfig", "EncoderOptions",
           "EncoderSpec", "OnnxEncoder", "TorchEncoder", "cpu_runtime", "build_encoder", "build_transform",
           "load_state_dict", "sha256_file"]
