"""Encoder registry: ``build_encoder("efficientnet-lite0")``, ``ENCODERS.names()``; one file per encoder family."""
from __future__ import annotations

from pathlib import Path

from .. import plugins
from ._base import (ENCODERS, Encoder, OnnxEncoder, TorchEncoder, build_transform, cpu_runtime, load_state_dict,
                    sha256_file)


def build_encoder(name: str, weights: str | Path | None = None) -> Encoder:
    """Build a registered encoder by name (exact, or ``family:arg``); ``weights`` overrides its weights."""
    builder, arg = ENCODERS.lookup(name)
    return builder(arg, Path(weights) if weights else None)


plugins.import_all(__import__(__name__, fromlist=["_"]))

__all__ = ["ENCODERS", "Encoder", "OnnxEncoder", "TorchEncoder", "cpu_runtime", "build_encoder", "build_transform",
           "load_state_dict", "sha256_file"]
