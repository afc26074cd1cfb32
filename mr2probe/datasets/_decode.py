"""Image bytes → uint8 RGB tensors [3, H, W], the pixels PIL gives for the same file.

JPEG is decoded by ``torchvision.io.decode_jpeg`` (libjpeg-turbo on the CPU, the same decoder PIL uses: identical
pixels; nvJPEG on a CUDA device, batched); every other format (PNG, BMP, TIFF, WebP, ...) and images held in
memory go through PIL, converted to RGB as :meth:`ImageSplit.image` does. A file that cannot be decoded is one
:class:`UserError` line naming it. (torchvision 0.29 marks its image decoders deprecated in favour of TorchCodec;
the warning is silenced here, where we call them.)
"""
from __future__ import annotations

import io
import re
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from PIL import Image

from ..errors import UserError
from ._torchvision import one_line

JPEG_SIGNATURE = b"\xff\xd8\xff"  # SOI marker followed by the first segment's marker
_TORCHVISION_PLACE = re.compile(r"^[\w.]+, \S+:\d+, ")  # "decode_jpeg, .../decode_jpeg.cpp:171, " before the reason


def is_jpeg(data: bytes | torch.Tensor) -> bool:
    """True when ``data`` (file bytes, or a uint8 tensor of them) starts with the JPEG signature."""
    head = bytes(data[:3].tolist()) if isinstance(data, torch.Tensor) else bytes(data[:3])
    return head == JPEG_SIGNATURE


def as_byte_tensor(data: bytes) -> torch.Tensor:
    """File bytes as a 1-D uint8 tensor (no copy: the tensor shares ``data``'s buffer and is never written)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "the given buffer is not writable": we only read it
        return torch.frombuffer(data, dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)


def pil_pixels(img: Image.Image) -> torch.Tensor:
    """A PIL image as uint8 RGB [3, H, W] (a channels-last view of one copy of its pixels)."""
    rgb = img if img.mode == "RGB" else img.convert("RGB")
    return torch.from_numpy(np.array(rgb, dtype=np.uint8)).permute(2, 0, 1)


def _jpeg_decoder():  # noqa: ANN202 - torchvision's decode_jpeg and ImageReadMode, warnings silenced
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from torchvision.io import ImageReadMode, decode_jpeg
    return decode_jpeg, ImageReadMode.RGB


def decode_rgb(data: bytes, name: str | Path) -> torch.Tensor:
    """The bytes of one image file → uint8 RGB [3, H, W] on the CPU; ``name`` is the file, for the error line."""
    if is_jpeg(data):
        decode_jpeg, rgb = _jpeg_decoder()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                return decode_jpeg(as_byte_tensor(data), mode=rgb)
        except RuntimeError as e:
            raise UserError(f"cannot read image {name}: {_TORCHVISION_PLACE.sub('', one_line(e))}") from None
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            return pil_pixels(img)
    except (OSError, Image.DecompressionBombError, ValueError) as e:
        raise UserError(f"cannot read image {name}: {one_line(e)}") from None


def decode_jpegs(datas: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """JPEG files (1-D uint8 CPU tensors of their bytes) decoded together on ``device`` (nvJPEG on CUDA, batched)
    → uint8 RGB [3, H, W] tensors there. Raises torchvision's RuntimeError when one of them cannot be decoded."""
    decode_jpeg, rgb = _jpeg_decoder()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        out = decode_jpeg(list(datas), mode=rgb, device=device)
    return list(out)
