"""The encoder registry, the Encoder interface and the typed description of an encoder (:class:`EncoderConfig`).

An entry is an :class:`EncoderSpec` subclass registered with ``@ENCODERS.register("name")`` (exact) or
``@ENCODERS.register("family:")``; it is built through one signature, ``ENCODERS.create(name, weights=...)`` =
``spec.build(EncoderOptions(arg=<text after the colon>, weights=...))``. An exact entry declares its
:class:`EncoderConfig` (feature dim and preprocessing) as the class attribute ``config``; a family's depends on the
member and is known once built. Every encoder carries its config: ``preprocessing`` is its recorded form
(JSON-able, stored in the feature file); ``preprocess`` applies it to uint8 image tensors, batched on the encoder's
device (what extraction runs), and ``transform`` to one PIL RGB image on the CPU (the PIL kernels; extraction's
``--preprocess workers``).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, ClassVar, Sequence

import torch
from PIL import Image
from torchvision import transforms as T
from torchvision.transforms.v2 import functional as TF

from ..errors import UserError
from ..featurestore import file_sha256 as sha256_file
from ..registry import Options, Registry, Spec

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
INTERPOLATIONS = ("nearest", "bilinear", "bicubic")
CROP_MODES = ("center", "squash")


@dataclass(frozen=True)
class EncoderConfig:
    """What an encoder gives and how it wants its input, after timm's ``PretrainedCfg``.

    Features: [B, ``dim``] (None: known once the encoder is built). Preprocessing of an image: resize with
    ``interpolation`` to ``resize`` (default ⌊size / crop_pct⌋, size = ``input_size[1]``) on the short side (crop
    mode ``center``) or on both sides (``squash``), centre-crop size × size, then ``x = (pixel/255 − mean) / std``
    per channel. ``extra``: further (key, value) pairs recorded with the preprocessing (e.g. the model's own
    wording of its scaling)."""

    dim: int | None = None
    input_size: tuple[int, int, int] = (3, 224, 224)
    interpolation: str = "bilinear"
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    crop_pct: float = 0.875
    crop_mode: str = "center"
    resize: int | None = None
    extra: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        channels, h, w = self.input_size
        failed = {f"input_size {self.input_size} is not (3, S, S)": channels != 3 or h != w or h < 1,
                  f"interpolation {self.interpolation!r} is not one of {INTERPOLATIONS}":
                      self.interpolation not in INTERPOLATIONS,
                  f"crop_mode {self.crop_mode!r} is not one of {CROP_MODES}": self.crop_mode not in CROP_MODES,
                  f"crop_pct {self.crop_pct} is not in (0, 1]": not 0 < self.crop_pct <= 1,
                  "mean and std need 3 values each, std > 0": len(self.mean) != 3 or len(self.std) != 3
                  or min(self.std) <= 0,
                  f"dim {self.dim} is not a positive integer": self.dim is not None and self.dim < 1}
        if any(failed.values()):
            raise ValueError(f"EncoderConfig: {'; '.join(m for m, bad in failed.items() if bad)}")

    @property
    def size(self) -> int:
        """The crop's side, ``input_size[1]``."""
        return self.input_size[1]

    def preprocessing(self) -> dict[str, Any]:
        """The recorded (JSON-able) form, as :func:`build_transform` reads it: ``{"resize": r (or [r, r] when
        squashed), "crop": size, "interpolation", "mean": [3], "std": [3], **extra}``."""
        r = self.resize or math.floor(self.size / self.crop_pct)
        return {"resize": [r, r] if self.crop_mode == "squash" else r, "crop": self.size,
                "interpolation": self.interpolation, "mean": [float(m) for m in self.mean],
                "std": [float(s) for s in self.std], **dict(self.extra)}

    def with_dim(self, dim: int) -> "EncoderConfig":
        return replace(self, dim=int(dim))


@dataclass(frozen=True)
class EncoderOptions(Options):
    """What an encoder build takes: ``arg`` (after the family prefix) and ``weights`` (a file to load instead of
    the entry's own weights; None: its own)."""

    weights: Path | None = None


class EncoderSpec(Spec):
    """An encoder entry: ``build(options) -> Encoder``; exact entries declare their ``config``."""

    Options = EncoderOptions
    config: ClassVar[EncoderConfig | None] = None  # None: the family member decides (known once built)

    @classmethod
    def build(cls, options: EncoderOptions) -> "Encoder":
        raise NotImplementedError(f"{cls.__name__} does not define build(options)")


class Encoder(ABC):
    """A frozen image encoder: ``encode(batch[B,3,H,W]) -> features[B, config.dim]``."""

    name: str
    config: EncoderConfig
    weights_sha256: str | None = None
    readout: dict[str, Any] | None = None  # a ViT token readout (see readout.py); None: the encoder's own output
    device: torch.device = torch.device("cpu")

    @property
    def dim(self) -> int:
        return int(self.config.dim)  # type: ignore[arg-type]

    @property
    def preprocessing(self) -> dict[str, Any]:
        return self.config.preprocessing()

    def transform(self, img: Image.Image) -> torch.Tensor:
        if getattr(self, "_transform_of", None) is not self.config:
            self._transform, self._transform_of = build_transform(self.preprocessing), self.config
        return self._transform(img)

    def preprocess(self, groups: Sequence[torch.Tensor]) -> torch.Tensor:
        """:func:`preprocess_uint8` with this encoder's preprocessing: uint8 groups → the batch to encode."""
        return preprocess_uint8(groups, self.preprocessing)

    @abstractmethod
    def encode(self, batch: torch.Tensor) -> torch.Tensor:
        """Features of a preprocessed batch (already on ``self.device``), float, shape [B, dim]."""

    def to(self, device: torch.device | str) -> "Encoder":
        self.device = torch.device(device)
        return self


class TorchEncoder(Encoder):
    """An ``nn.Module`` whose forward returns [B, dim] features; eval mode, inference only, optional autocast."""

    def __init__(self, name: str, module: torch.nn.Module, config: EncoderConfig,
                 weights_sha256: str | None = None) -> None:
        if config.dim is None:
            raise ValueError(f"TorchEncoder {name!r}: its config needs the feature dim")
        self.name, self.module, self.config = name, module.eval(), config
        self.weights_sha256 = weights_sha256
        self.amp_dtype: torch.dtype | None = None  # set by the extraction engine on CUDA
        for p in self.module.parameters():
            p.requires_grad_(False)

    def to(self, device: torch.device | str) -> "TorchEncoder":
        super().to(device)
        self.module.to(self.device)
        if self.device.type == "cuda":
            self.module.to(memory_format=torch.channels_last)
        return self

    @torch.inference_mode()
    def encode(self, batch: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cuda":
            batch = batch.contiguous(memory_format=torch.channels_last)
        with torch.autocast(self.device.type, dtype=self.amp_dtype or torch.bfloat16,
                            enabled=self.amp_dtype is not None):
            out = self.module(batch)
        return out.float().flatten(1)


def build_transform(pre: dict[str, Any]) -> Callable[[Image.Image], torch.Tensor]:
    """PIL → tensor from a preprocessing description:
    ``{"resize": int, "crop": int, "interpolation": "bilinear"|"bicubic", "mean": [3], "std": [3]}``.
    ``x = (pixel/255 - mean) / std``; e.g. EfficientNet-Lite's (x − 127)/128 is mean 127/255, std 128/255."""
    interp = T.InterpolationMode(pre.get("interpolation", "bilinear"))
    return T.Compose([
        T.Resize(pre["resize"], interpolation=interp),
        T.CenterCrop(pre["crop"]),
        T.ToTensor(),
        T.Normalize(pre["mean"], pre["std"]),
    ])


def preprocess_uint8(groups: Sequence[torch.Tensor], pre: dict[str, Any]) -> torch.Tensor:
    """:func:`build_transform` on uint8 RGB tensors, batched where they share a size.

    ``groups``: [n, 3, H, W] uint8 tensors (one size per group, on the device that should do the work) →
    [Σn, 3, crop, crop] float32, the groups' rows in order. Per group: the short side resized to ``resize``
    (the long side to ⌊resize · long / short⌋, as ``T.Resize(int)``), antialiased with the named kernel (the
    tensor counterparts of PIL's; the result rounded and clamped to uint8 as PIL's is), centre-cropped to
    ``crop`` (zero-padded where smaller), then ``x = (pixel/255 − mean) / std`` on the whole batch."""
    interp = T.InterpolationMode(pre.get("interpolation", "bilinear"))
    crops = [TF.center_crop(TF.resize(g, [pre["resize"]], interpolation=interp, antialias=True), [pre["crop"]])
             for g in groups]
    x = (torch.cat(crops) if len(crops) > 1 else crops[0]).float()
    mean = torch.tensor(pre["mean"], dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    std = torch.tensor(pre["std"], dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    return x.div_(255).sub_(mean).div_(std)


def load_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """Load a checkpoint safely (``weights_only=True``: no pickled code runs); unwrap ``state_dict``/``model``."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"weights file {path} not found")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure is a bad file, reported in one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"refusing to load {path}: not a plain tensor checkpoint ({first[:200]})") from None
    for key in ("state_dict", "model", "module"):
        if isinstance(obj, dict) and key in obj and isinstance(obj[key], dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise UserError(f"{path} does not hold a state dict of tensors")
    return obj


ENCODERS: Registry[type[EncoderSpec]] = Registry("encoder", base=EncoderSpec, group="mr2probe.encoders")


class OnnxEncoder(Encoder):
    """An ONNX image encoder run by onnxruntime: input [B,3,H,W] float32 → output [B, dim] (CLS / pooled).

    ``output`` names the graph tensor to read (a cut inside the graph is allowed: the graph is truncated
    there first); ``token`` picks one token of a [B, T, C] output (0 = CLS)."""

    def __init__(self, name: str, model_path: Path, config: EncoderConfig, output: str | None = None,
                 token: int | None = None, weights_sha256: str | None = None, threads: int = 0) -> None:
        import onnxruntime as ort

        self.name, self.config, self.token = name, config, token
        self.weights_sha256 = weights_sha256 or sha256_file(model_path)
        model_bytes = _truncate_onnx(model_path, output) if output else Path(model_path).read_bytes()
        opts = ort.SessionOptions()
        # onnxruntime ignores OMP_NUM_THREADS; follow torch's thread count (which honours it) unless told
        opts.intra_op_num_threads = threads or torch.get_num_threads()
        try:
            self.session = ort.InferenceSession(model_bytes, opts, providers=_ort_providers())
        except Exception as e:  # noqa: BLE001 - onnxruntime raises its own exception types
            raise UserError(f"cannot load ONNX model {model_path}: {str(e).splitlines()[0][:160]}") from None
        self.input_name = self.session.get_inputs()[0].name
        dim = int(self.encode(torch.zeros(1, 3, config.size, config.size)).shape[1])
        if config.dim is not None and config.dim != dim:
            raise UserError(f"{name}: {model_path} gives {dim} features, not the {config.dim} of {name}")
        self.config = config.with_dim(dim)

    def encode(self, batch: torch.Tensor) -> torch.Tensor:
        out = self.session.run(None, {self.input_name: batch.detach().cpu().float().numpy()})[0]
        out = torch.from_numpy(out)
        if self.token is not None and out.ndim == 3:
            out = out[:, self.token]
        return out.float().flatten(1)


def _ort_providers() -> list[str]:
    import onnxruntime as ort

    avail = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in avail]


def _truncate_onnx(model_path: Path, output: str) -> bytes:
    """The model's graph cut so that tensor ``output`` is the only graph output."""
    import onnx
    from onnx import utils as onnx_utils

    model = onnx.load(str(model_path))
    inputs = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    produced = {o for n in model.graph.node for o in n.output}
    if output not in produced:
        raise UserError(f"{model_path} has no tensor named {output!r} to cut the graph at")
    if output not in {v.name for v in model.graph.value_info}:
        # recent onnx's Extractor needs the cut tensor's type; intermediate ones are often not annotated
        model = onnx.shape_inference.infer_shapes(model)
    cut = onnx_utils.Extractor(model).extract_model(inputs, [output])
    return cut.SerializeToString()


def export_onnx(encoder: TorchEncoder) -> Path:
    """Export a TorchEncoder's module to ONNX once (cached by name + weights hash) for the CPU runtime."""
    import warnings

    cache = Path(os.environ.get("MR2PROBE_CACHE", Path.home() / ".cache" / "mr2probe")) / "onnx"
    cache.mkdir(parents=True, exist_ok=True)
    readout = f"|{json.dumps(encoder.readout, sort_keys=True)}" if encoder.readout else ""
    key = hashlib.sha256(f"{encoder.name}|{encoder.weights_sha256}|{json.dumps(encoder.preprocessing)}{readout}"
                         .encode()).hexdigest()[:16]
    path = cache / f"{encoder.name.replace('/', '_').replace(':', '_')}-{key}.onnx"
    if not path.exists():
        size = encoder.config.size
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        fastpath = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)  # nn.MultiheadAttention's fused kernel has no ONNX form
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(encoder.module.cpu(), torch.zeros(2, 3, size, size), str(tmp), input_names=["x"],
                                  output_names=["features"], dynamic_axes={"x": {0: "b"}}, dynamo=False)
        finally:
            torch.backends.mha.set_fastpath_enabled(fastpath)
        os.replace(tmp, path)
    return path


def cpu_runtime(encoder: Encoder, runtime: str) -> Encoder:
    """On CPU, run a TorchEncoder through onnxruntime when ``runtime`` is "onnx" (or "auto" and onnxruntime
    is installed): depthwise-conv and ViT graphs run several times faster there than in eager PyTorch."""
    if runtime == "torch" or not isinstance(encoder, TorchEncoder) or encoder.device.type != "cpu":
        return encoder
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        if runtime == "onnx":
            raise UserError("--runtime onnx needs: pip install onnxruntime onnx") from None
        return encoder
    config = replace(encoder.config, extra=encoder.config.extra + (("runtime", "onnxruntime"),))
    onnx_enc = OnnxEncoder(encoder.name, export_onnx(encoder), config, weights_sha256=encoder.weights_sha256)
    onnx_enc.readout = encoder.readout
    return onnx_enc
