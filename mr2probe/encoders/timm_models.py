"""timm backbones: ``timm:NAME[@random]``, pooled features (the model built with ``num_classes=0``).

* ``NAME`` is any timm model name, with or without a pretrained tag: ``timm:resnet50``,
  ``timm:vit_base_patch16_224.mae``, ``timm:vit_large_patch16_224.mae``,
  ``timm:vit_base_patch16_224.augreg_in21k_ft_in1k``. timm downloads the tag's weights (``pretrained=True``)
  unless ``--weights PATH`` is given: then PATH (a timm state dict, loaded with ``weights_only=True``; the
  classifier's keys are dropped, the model family's checkpoint filter is applied) is loaded strictly and
  its sha256 recorded.
* ``hf-hub:ORG/NAME`` (``timm:hf-hub:timm/vit_base_patch16_224.augreg2_in21k_ft_in1k``, or the same name
  without ``timm:``) is a model on the Hugging Face hub: timm reads its configuration (architecture, preprocessing)
  and weights from there (``timm.create_model("hf-hub:ORG/NAME")``; online, cached by huggingface_hub).
* ``@random`` builds the model with random weights (seeded: the same on every build), offline
  (``timm:resnet18@random``): for tests and smoke runs.

Preprocessing (the encoder's :class:`~._base.EncoderConfig`) is ``timm.data.resolve_data_config`` of the model's
pretrained config: resize to
``floor(size / crop_pct)`` (short side, or both sides for crop mode ``squash``), centre-crop ``size``, the
tag's interpolation and mean/std.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from ..errors import UserError
from ._base import ENCODERS, EncoderConfig, EncoderOptions, EncoderSpec, TorchEncoder, load_state_dict, sha256_file

OPTIONS = ("random",)
HF_HUB = "hf-hub:"


def parse_name(arg: str) -> tuple[str, bool]:
    """``NAME[@random]`` → (name, random weights?); UserError for an unknown model or option."""
    import timm

    name, _, option = arg.partition("@")
    if option and option not in OPTIONS:
        raise UserError(f"timm:{arg}: unknown option @{option}; known: {', '.join('@' + o for o in OPTIONS)}")
    if name.startswith(HF_HUB):
        repo = name[len(HF_HUB):]
        if repo.count("/") != 1 or not all(repo.split("/")):
            raise UserError(f"timm:{arg}: a Hugging Face hub model is named hf-hub:ORG/NAME, e.g. "
                            "hf-hub:timm/vit_base_patch16_224.augreg2_in21k_ft_in1k")
    elif not name or not timm.is_model(name):
        raise UserError(f"timm:{arg}: unknown timm model {name!r} (see timm.list_models())")
    return name, option == "random"


def config_of(cfg: dict[str, Any], dim: int | None = None) -> EncoderConfig:
    """A ``resolve_data_config`` dict → the encoder's config (resize ⌊size / crop_pct⌋, as timm's eval transform);
    crop_pct and crop_mode are recorded with the preprocessing too."""
    _, h, w = cfg["input_size"]
    if h != w:
        raise UserError(f"non-square timm input size {h}x{w} is not supported")
    crop_pct = float(cfg.get("crop_pct") or 0.875)
    mode = cfg.get("crop_mode") or "center"
    if mode not in ("center", "squash"):
        raise UserError(f"timm crop mode {mode!r} is not supported (only 'center' and 'squash')")
    return EncoderConfig(dim=dim, input_size=(3, int(h), int(h)), crop_pct=crop_pct, crop_mode=mode,
                         interpolation=cfg.get("interpolation", "bicubic"), mean=tuple(map(float, cfg["mean"])),
                         std=tuple(map(float, cfg["std"])), extra=(("crop_pct", crop_pct), ("crop_mode", mode)))


def _load_weights(model: torch.nn.Module, path: Path) -> None:
    """Load a timm state dict into the classifier-less model; UserError on a mismatch."""
    state = load_state_dict(path)
    family_filter = getattr(sys.modules.get(type(model).__module__), "checkpoint_filter_fn", None)
    if callable(family_filter):
        state = family_filter(state, model)
    heads = model.pretrained_cfg.get("classifier") or ()
    heads = (heads,) if isinstance(heads, str) else tuple(heads)
    state = {k: v for k, v in state.items() if not any(k.startswith(h + ".") for h in heads)}
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        raise UserError(f"{path} does not match this timm model: {' '.join(lines[:2])[:300]}") from None


@ENCODERS.register("timm:")
class Timm(EncoderSpec):
    """timm:NAME[@random] - any timm model or hf-hub:ORG/NAME, pooled features (num_classes=0); @random = random init"""

    @classmethod
    def build(cls, options: EncoderOptions) -> TorchEncoder:
        return build_timm(options.arg, options.weights, cls.name + options.arg)


@ENCODERS.register(HF_HUB)
class HfHub(EncoderSpec):
    """hf-hub:ORG/NAME[@random] - a timm model on the Hugging Face hub (as timm:hf-hub:ORG/NAME)"""

    @classmethod
    def build(cls, options: EncoderOptions) -> TorchEncoder:
        return build_timm(HF_HUB + options.arg, options.weights, cls.name + options.arg)


def build_timm(arg: str, weights: Path | None, label: str) -> TorchEncoder:
    """The encoder of ``NAME[@random]`` (see the module doc), named ``label``."""
    import timm
    from timm.data import resolve_data_config

    name, random_init = parse_name(arg)
    download = not random_init and weights is None
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)  # random init is reproducible (and so is a cached ONNX export of it)
            model = timm.create_model(name, pretrained=download, num_classes=0)
    except (OSError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        hint = "; without internet pass --weights PATH, or use @random for random weights" if download else ""
        raise UserError(f"cannot build {label} ({first}){hint}") from None
    if weights is not None:
        _load_weights(model, weights)
    dim = int(getattr(model, "head_hidden_size", None) or model.num_features)
    config = config_of(resolve_data_config({}, model=model), dim)
    return TorchEncoder(label, model, config, sha256_file(weights) if weights else None)
