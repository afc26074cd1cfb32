"""Encoder registry: ``build_encoder("efficientnet-lite0")``, ``ENCODERS.names()``; one file per encoder family."""
from __future__ import annotations

from pathlib import Path

from .. import plugins
from ._base import (ENCODERS, Encoder, OnnxEncoder, TorchEncoder, build_transform, cpu_runtime, load_state_dict,
                    sha256_file)
from .readout import POOLS, apply_readout, check_readout


def build_encoder(name: str, weights: str | Path | None = None, pool: str | None = None,
                  blocks: int | None = None) -> Encoder:
    """Build a registered encoder by name (exact, or ``family:arg``); ``weights`` overrides its weights; ``pool``
    / ``blocks`` set a ViT token readout (:mod:`.readout`; None: the encoder's own pooled output)."""
    check_readout(pool, blocks)
    builder, arg = ENCODERS.lookup(name)
    return apply_readout(builder(arg, Path(weights) if weights else None), pool, blocks)


plugins.import_all(__import__(__name__, fromlist=["_"]))

__all__ = ["ENCODERS", "POOLS", "Encoder", "OnnxEncoder", "TorchEncoder", "cpu_runtime", "build_encoder",
           "build_transform", "load_state_dict", "sha256_file"]
