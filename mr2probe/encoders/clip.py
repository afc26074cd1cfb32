"""CLIP image towers through open_clip: ``clip:ARCH/TAG[@preproj]``.

* ``ARCH/TAG`` is any pair of ``open_clip.list_pretrained()``, e.g. ``clip:ViT-B-16/openai``, also written as
  open_clip writes the pair, ``ARCH,TAG`` (``clip:ViT-B-32,laion2b_s34b_b79k``); the weights are
  downloaded by open_clip (``pretrained=TAG``) unless ``--weights PATH`` is given: then the model is built
  without weights and PATH (a state dict of the whole CLIP model or of its ``visual.*`` tower, loaded with
  ``weights_only=True``) is loaded into it, and its sha256 is recorded.
* ``TAG`` = ``random`` (or ``none``) builds ARCH with random weights (seeded: the same on every build) and the
  architecture's default preprocessing: offline, for tests and smoke runs (``clip:ViT-B-32/random``).
* Features are ``model.encode_image(x)``, unnormalized (the image embedding, e.g. 512-d for ViT-B/32).
  The suffix ``@preproj`` gives the ViT tower's pooled features before the projection instead
  (``clip:ViT-B-16/openai@preproj``: 768-d), i.e. the transformer width.

Preprocessing (the encoder's :class:`~._base.EncoderConfig`) follows open_clip's configuration of the tag (image
size, mean/std, interpolation, resize mode): ``shortest`` = resize the short side to the image size and centre-crop,
``squash`` = resize both sides (recorded as ``resize: [size, size]``). Tags trained with QuickGELU (OpenAI's) are
built with QuickGELU.
"""
from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any, Iterator

import torch

from ..errors import UserError
from ._base import ENCODERS, EncoderConfig, EncoderOptions, EncoderSpec, TorchEncoder, load_state_dict, sha256_file

RANDOM_TAGS = ("random", "none")
OPTIONS = ("preproj",)
RESIZE_MODES = {"shortest": "center", "squash": "squash"}  # open_clip's resize mode → EncoderConfig.crop_mode


class _ImageTower(torch.nn.Module):
    """A CLIP model reduced to ``encode_image`` (unnormalized)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.encode_image(x)


def parse_name(arg: str) -> tuple[str, str | None, bool]:
    """``ARCH/TAG[@preproj]`` or ``ARCH,TAG[@preproj]`` (open_clip's ``model_name, pretrained`` pair) → (arch,
    tag or None for random weights, preproj); UserError if unknown."""
    import open_clip

    base, _, option = arg.partition("@")
    arch, _, tag = base.partition("," if "," in base else "/")
    if option and option not in OPTIONS:
        raise UserError(f"clip:{arg}: unknown option @{option}; known: {', '.join('@' + o for o in OPTIONS)}")
    if arch not in open_clip.list_models():
        raise UserError(f"clip:{arg}: unknown open_clip architecture {arch!r} (see open_clip.list_models())")
    tags = open_clip.list_pretrained_tags_by_model(arch)
    if not tag:
        raise UserError(f"clip:{arg}: name a pretrained tag, clip:{arch}/TAG with TAG one of "
                        f"{', '.join(tags + ['random'])}")
    if tag in RANDOM_TAGS:
        return arch, None, option == "preproj"
    if tag not in tags:
        raise UserError(f"clip:{arg}: {arch} has no pretrained tag {tag!r}; known: {', '.join(tags + ['random'])}")
    return arch, tag, option == "preproj"


def config_of(cfg: dict[str, Any], dim: int | None = None) -> EncoderConfig:
    """open_clip's preprocess config (size, mean, std, interpolation, resize_mode) → the encoder's config: resize
    to the image size (crop_pct 1), on the short side (``shortest``) or both sides (``squash``), then centre-crop."""
    size = cfg["size"]
    if isinstance(size, (tuple, list)):
        if size[0] != size[1]:
            raise UserError(f"non-square CLIP input size {tuple(size)} is not supported")
        size = size[0]
    mode = cfg.get("resize_mode", "shortest")
    if mode not in RESIZE_MODES:
        raise UserError(f"CLIP resize mode {mode!r} is not supported (only 'shortest' and 'squash')")
    return EncoderConfig(dim=dim, input_size=(3, int(size), int(size)), crop_pct=1.0, crop_mode=RESIZE_MODES[mode],
                         interpolation=cfg.get("interpolation", "bicubic"), mean=tuple(map(float, cfg["mean"])),
                         std=tuple(map(float, cfg["std"])), extra=(("resize_mode", mode),))


@contextlib.contextmanager
def _quiet(enabled: bool) -> Iterator[None]:
    """Silence log records up to WARNING while active (when ``enabled``)."""
    if enabled:
        logging.disable(logging.WARNING)
    try:
        yield
    finally:
        if enabled:
            logging.disable(logging.NOTSET)


def _load_weights(model: torch.nn.Module, path: Path) -> None:
    """Load a state dict of the whole model (or of ``visual.*`` only) strictly; UserError on a mismatch."""
    from open_clip.model import resize_pos_embed

    state = load_state_dict(path)
    if all(k.startswith("module.") for k in state):
        state = {k[len("module."):]: v for k, v in state.items()}
    resize_pos_embed(state, model)
    target: torch.nn.Module = model
    if all(k.startswith("visual.") for k in state):
        target, state = model.visual, {k[len("visual."):]: v for k, v in state.items()}
    try:
        target.load_state_dict(state, strict=True)
    except RuntimeError as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        raise UserError(f"{path} does not match this CLIP model: {' '.join(lines[:2])[:300]}") from None


def build_clip(arch: str, tag: str | None, preproj: bool, weights: Path | None, name: str) -> TorchEncoder:
    """Build the encoder for (arch, tag); ``tag=None`` means random weights."""
    import open_clip
    from open_clip.transform import PreprocessCfg

    tag_cfg = open_clip.get_pretrained_cfg(arch, tag) if tag else {}
    keys = PreprocessCfg.__dataclass_fields__
    force_pre = {k: v for k, v in tag_cfg.items() if k in keys}
    download = tag if weights is None else None
    try:
        with _quiet(download is None), torch.random.fork_rng(devices=[]):  # quiet: we may load weights ourselves
            torch.manual_seed(0)  # random init is reproducible (and so is a cached ONNX export of it)
            model = open_clip.create_model(arch, pretrained=download,
                                           force_quick_gelu=bool(tag_cfg.get("quick_gelu")),
                                           force_preprocess_cfg=force_pre)
    except (OSError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        hint = (f"; without internet pass --weights PATH, or use clip:{arch}/random for random weights"
                if download else "")
        raise UserError(f"cannot build {name} ({first}){hint}") from None
    if weights is not None:
        _load_weights(model, weights)
    dim = int(open_clip.get_model_config(arch)["embed_dim"])
    if preproj:
        proj = getattr(model.visual, "proj", None)
        if not isinstance(proj, torch.Tensor):
            raise UserError(f"{name}: @preproj needs a ViT image tower with a projection; "
                            f"{arch}'s tower ({type(model.visual).__name__}) has none to skip")
        dim = int(proj.shape[0])
        model.visual.proj = None
    config = config_of(open_clip.get_model_preprocess_cfg(model), dim)
    return TorchEncoder(name, _ImageTower(model), config, sha256_file(weights) if weights else None)


@ENCODERS.register("clip:")
class Clip(EncoderSpec):
    """clip:ARCH/TAG[@preproj] - open_clip image tower (TAG random = random init; @preproj = pre-projection)"""

    @classmethod
    def build(cls, options: EncoderOptions) -> TorchEncoder:
        arch, tag, preproj = parse_name(options.arg)
        return build_clip(arch, tag, preproj, options.weights, cls.name + options.arg)
