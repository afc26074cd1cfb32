"""MoCo v2 ResNet-50: ``mocov2:CHECKPOINT`` (e.g. ``mocov2:checkpoints/moco_v2_800ep_pretrain.pth.tar``).

CHECKPOINT is an official MoCo v2 pretraining checkpoint (https://github.com/facebookresearch/moco), a dict
whose ``state_dict`` holds the query encoder as ``module.encoder_q.*``. It is loaded with
``weights_only=True`` (a file carrying pickled code is refused); the query encoder minus its projection
head (``fc``) is loaded strictly into torchvision's ResNet-50, whose global-pooled 2048-d output is the
feature. ``--weights PATH`` overrides the path in the name. Preprocessing: ImageNet mean/std, resize 256,
centre-crop 224, bilinear.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torchvision.models import resnet50

from ..errors import UserError
from ._base import ENCODERS, EncoderConfig, EncoderOptions, EncoderSpec, TorchEncoder, load_state_dict, sha256_file

OFFICIAL_URL = "https://dl.fbaipublicfiles.com/moco/moco_checkpoints/moco_v2_800ep/moco_v2_800ep_pretrain.pth.tar"
PREFIX = "module.encoder_q."
CONFIG = EncoderConfig(dim=2048, input_size=(3, 224, 224), crop_pct=0.875, interpolation="bilinear")  # ImageNet


def query_encoder_state(state: dict[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
    """The backbone's weights from a MoCo state dict: ``module.encoder_q.*`` without the ``fc`` head."""
    query = {k[len(PREFIX):]: v for k, v in state.items() if k.startswith(PREFIX)}
    if not query:
        example = next(iter(state), "none")
        raise UserError(f"{path} is not a MoCo checkpoint: no '{PREFIX}*' keys (first key: {example!r})")
    return {k: v for k, v in query.items() if not k.startswith("fc.")}


def backbone(state: dict[str, torch.Tensor], path: Path) -> torch.nn.Module:
    """torchvision ResNet-50 without its classifier (fc = identity), loaded strictly from ``state``."""
    net = resnet50(weights=None)
    net.fc = torch.nn.Identity()
    try:
        net.load_state_dict(state, strict=True)
    except RuntimeError as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        raise UserError(f"{path}: MoCo query encoder is not a ResNet-50: {' '.join(lines[:2])[:300]}") from None
    return net


@ENCODERS.register("mocov2:")
class MocoV2(EncoderSpec):
    """mocov2:CHECKPOINT - MoCo v2 ResNet-50 (official checkpoint, query encoder), 2048-d pooled features"""

    config = CONFIG  # the same for every checkpoint

    @classmethod
    def build(cls, options: EncoderOptions) -> TorchEncoder:
        arg, weights = options.arg, options.weights
        if not arg and weights is None:
            raise UserError("mocov2: needs the checkpoint path: mocov2:PATH (e.g. moco_v2_800ep_pretrain.pth.tar)")
        path = weights or Path(arg)
        if not path.is_file():
            raise UserError(f"MoCo v2 checkpoint {path} not found; get the official one, e.g. wget -P {path.parent} "
                            f"{OFFICIAL_URL}")
        net = backbone(query_encoder_state(load_state_dict(path), path), path)
        return TorchEncoder(f"{cls.name}{arg or path.name}", net, cls.config, sha256_file(path))
