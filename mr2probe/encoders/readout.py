"""Token readouts of ViT encoders (``extract --pool cls|avg|cls+avg --blocks N``), as in DINOv2's linear evaluation.

For each of the last ``N`` transformer blocks, block ``b``'s output tokens ``t_b = [cls, p_1 … p_L]`` (prefix tokens
first: the class token, then any register / distillation tokens, then the ``L`` patch tokens) go through the model's
final LayerNorm ``LN`` (timm: ``norm``, or ``fc_norm`` where the model norms after pooling; open_clip: ``ln_post``;
torch hub DINOv2: ``norm``, its patch tokens without the register tokens),
and the block contributes

* ``cls``:     ``LN(cls_b)``                                  (C values)
* ``avg``:     ``(1/L) Σ_i LN(p_{b,i})``                       (C values)
* ``cls+avg``: ``[LN(cls_b), (1/L) Σ_i LN(p_{b,i})]``          (2C values)

The feature is the blocks' parts concatenated, oldest block first (so its last part is the ``--blocks 1`` feature):
``dim = N · C`` (``2 N C`` for ``cls+avg``). For an open_clip tower each part is then multiplied by the projection
(``C`` = the embedding size), or not with ``@preproj`` (``C`` = the transformer width). ``cls`` with ``N = 1`` is
exactly what a timm class-token ViT and a CLIP ViT give without a readout; DINOv2's own ``avgpool`` readout adds
the patch mean of the last block only, ``cls+avg`` here adds every block's.

Without ``--pool`` and ``--blocks`` an encoder gives its own pooled output (the default, unchanged). The readout is
recorded as the feature file's ``readout`` attribute: ``{"pool", "blocks", "norm", "projection"}``.
"""
from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from ..errors import UserError
from ._base import Encoder, TorchEncoder

POOLS = ("cls", "avg", "cls+avg")


def check_readout(pool: str | None, blocks: int | None) -> None:
    """UserError for an unknown ``pool`` or ``blocks`` < 1."""
    if pool is not None and pool not in POOLS:
        raise UserError(f"--pool must be one of {', '.join(POOLS)}, got {pool!r}")
    if blocks is not None and (isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 1):
        raise UserError(f"--blocks must be an integer ≥ 1, got {blocks!r}")


def readout_suffix(pool: str | None, blocks: int | None) -> str:
    """The part of a default feature-file name that tells readouts apart: ``""`` (the encoder's own output),
    ``"-avg"``, ``"-clsavg-b4"``, ``"-cls-b2"`` …"""
    if pool is None and blocks is None:
        return ""
    return f"-{(pool or 'cls').replace('+', '')}" + (f"-b{blocks}" if blocks and blocks > 1 else "")


class TokenReadout(nn.Module):
    """``forward(x) = concat_b pool(LN(tokens_b)) [@ proj]`` over the last ``blocks`` blocks (see the module doc).

    ``intermediates(x)`` must return ``{"image_intermediates": [B, L, C] patch tokens per block,
    "image_intermediates_prefix": [B, P, C] prefix tokens per block}`` for the last ``blocks`` blocks, as timm's
    and open_clip's ``forward_intermediates`` do."""

    def __init__(self, model: nn.Module, norm: nn.Module, pool: str, blocks: int, api: str,
                 proj: torch.Tensor | None = None) -> None:
        super().__init__()
        self.model, self.norm, self.pool, self.blocks, self.api = model, norm, pool, blocks, api
        self.proj = proj

    def intermediates(self, x: torch.Tensor) -> dict[str, list[torch.Tensor]]:
        if self.api == "timm":
            return self.model.forward_intermediates(x, indices=self.blocks, return_prefix_tokens=True, norm=False,
                                                    output_fmt="NLC", intermediates_only=True, output_dict=True)
        if self.api == "dinov2":  # DINOv2's own: (patch tokens without registers, class token) per block
            outs = self.model.get_intermediate_layers(x, n=self.blocks, return_class_token=True, norm=False)
            return {"image_intermediates": [p for p, _ in outs],
                    "image_intermediates_prefix": [c[:, None] for _, c in outs]}
        return self.model.forward_intermediates(x, indices=self.blocks, normalize_intermediates=False,
                                                intermediates_only=True, output_fmt="NLC", output_extra_tokens=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.intermediates(x)
        parts = []
        for patches, prefix in zip(out["image_intermediates"], out["image_intermediates_prefix"]):
            if "cls" in self.pool:
                parts.append(self.norm(prefix[:, 0]))
            if "avg" in self.pool:
                parts.append(self.norm(patches).mean(dim=1))
        feats = torch.stack(parts, dim=1)  # [B, parts, C]
        if self.proj is not None:
            feats = feats @ self.proj
        return feats.flatten(1)


def _timm_readout(model: nn.Module, name: str, pool: str, blocks: int) -> tuple[TokenReadout, int, str]:
    params = inspect.signature(model.forward_intermediates).parameters
    if not {"return_prefix_tokens", "output_dict"} <= set(params):
        raise UserError(f"{name}: --pool/--blocks need a timm ViT whose forward_intermediates returns its prefix "
                        f"tokens; {type(model).__name__} does not")
    if "cls" in pool and getattr(model, "cls_token", None) is None:
        raise UserError(f"{name} has no class token: use --pool avg")
    norm_name = "norm" if not isinstance(getattr(model, "norm", nn.Identity()), nn.Identity) else "fc_norm"
    norm = getattr(model, norm_name, None) or nn.Identity()
    norm_name = norm_name if not isinstance(norm, nn.Identity) else "none"
    return TokenReadout(model, norm, pool, blocks, api="timm"), int(model.embed_dim), norm_name


def _clip_readout(tower: nn.Module, name: str, pool: str, blocks: int) -> tuple[TokenReadout, int, str]:
    from open_clip.transformer import VisionTransformer

    visual = tower.model.visual
    if not isinstance(visual, VisionTransformer) or visual.attn_pool is not None:
        raise UserError(f"{name}: --pool/--blocks need an open_clip ViT image tower (class token, no attentional "
                        f"pooler); this one is {type(visual).__name__}")
    proj = visual.proj if isinstance(visual.proj, torch.Tensor) else None
    width = int(visual.class_embedding.shape[-1])
    dim = int(proj.shape[1]) if proj is not None else width
    return TokenReadout(visual, visual.ln_post, pool, blocks, api="open_clip", proj=proj), dim, "ln_post"


def _blocks_of(module: nn.Module) -> int:
    """How many transformer blocks ``module`` (a timm, open_clip or DINOv2 ViT) has."""
    if getattr(module, "chunked_blocks", False):  # DINOv2's chunked layout: the chunks hold the blocks
        return sum(1 for chunk in module.blocks for b in chunk if not isinstance(b, nn.Identity))
    blocks = getattr(module, "blocks", None)
    if blocks is None:
        blocks = module.transformer.resblocks
    return len(blocks)


def apply_readout(encoder: Encoder, pool: str | None, blocks: int | None) -> Encoder:
    """``encoder`` reading out ``pool`` over its last ``blocks`` blocks (see the module doc); unchanged when both
    are None. UserError when the encoder is not a timm or open_clip ViT, or has fewer blocks."""
    check_readout(pool, blocks)
    if pool is None and blocks is None:
        return encoder
    pool, blocks = pool or "cls", blocks or 1
    module = encoder.module if isinstance(encoder, TorchEncoder) else None
    from .clip import _ImageTower

    if isinstance(module, _ImageTower):
        readout, part, norm = _clip_readout(module, encoder.name, pool, blocks)
        projection: dict[str, Any] = {"projection": "after" if readout.proj is not None else "before"}
    elif module is not None and hasattr(module, "num_prefix_tokens") and hasattr(module, "forward_intermediates"):
        readout, part, norm = _timm_readout(module, encoder.name, pool, blocks)
        projection = {}
    elif module is not None and hasattr(module, "get_intermediate_layers") and hasattr(module, "num_register_tokens"):
        readout, part, norm = TokenReadout(module, module.norm, pool, blocks, api="dinov2"), module.embed_dim, "norm"
        projection = {}
    else:
        raise UserError(f"--pool/--blocks read the tokens of a ViT (timm:, clip: or dinov2_* hub ViTs); {encoder.name} "
                        "is not one: leave them out to use its own pooled output")
    depth = _blocks_of(readout.model)
    if blocks > depth:
        raise UserError(f"--blocks {blocks}: {encoder.name} has {depth} blocks")
    encoder.module = readout.eval()
    encoder.config = encoder.config.with_dim(part * blocks * (2 if pool == "cls+avg" else 1))
    encoder.readout = {"pool": pool, "blocks": blocks, "norm": norm, **projection}
    return encoder
