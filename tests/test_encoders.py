"""Encoder families, offline on CPU: every registry entry builds (random or bundled weights) and gives features
of the documented size; weight loading, MoCo checkpoint checks, the DINOv2 ONNX cut on real images, and the
torch → ONNX CPU runtime."""
from __future__ import annotations

import importlib.util
import tomllib
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mr2probe.encoders import ENCODERS, Encoder, EncoderSpec, build_encoder, cpu_runtime, sha256_file
from mr2probe.errors import UserError
from mr2probe.encoders.torchhub import NAMES as HUB_DINOV2
from mr2probe.recipes import load_recipe

REPO = Path(__file__).resolve().parents[1]

# Entries that cannot be built offline from their name alone (skipped by test_every_offline_entry_builds), each
# with the test that covers it instead; every other entry is built from the registry.
NOT_OFFLINE = {
    "mocov2:": "needs a checkpoint: test_mocov2_*",
    "onnx:": "needs a model file: test_onnx_family",
    "hf-hub:": "a Hugging Face hub model (internet): test_timm_hf_hub_names_reach_timm, the loader patched",
    **{name: "torch hub (internet): test_dinov2_hub_names, the loader patched" for name in HUB_DINOV2},
}
# a family's offline member (random weights): a new family needs one here or in NOT_OFFLINE
FAMILY_EXAMPLES = {"clip:": "clip:ViT-B-32/random", "timm:": "timm:resnet18@random"}


def shipped() -> list[str]:
    """The entries mr2probe registers itself (not test-only or plugin ones)."""
    return [n for n in ENCODERS.names() if ENCODERS.get(n).__module__.startswith("mr2probe.")]


def offline_examples() -> list[str]:
    """One buildable name per shipped entry not in NOT_OFFLINE (a family's example, else the name itself)."""
    return [FAMILY_EXAMPLES.get(n, n) for n in shipped() if n not in NOT_OFFLINE]


def _sample_dir() -> Path:
    """foolbox's bundled sample images (foolbox is installed without its dependencies: find, don't import)."""
    spec = importlib.util.find_spec("foolbox")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / "data").is_dir():
            return Path(folder) / "data"
    pytest.skip("foolbox sample images not installed (pip install --no-deps foolbox)")


def _image(name: str) -> Image.Image:
    return Image.open(_sample_dir() / name).convert("RGB")


def _batch(enc: Encoder, n: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    size = enc.config.size
    return torch.randn(n, 3, size, size, generator=g)


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _cos_dist(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(1 - torch.nn.functional.cosine_similarity(a, b, dim=0))


# ---------------------------------------------------------------- registry


def test_every_entry_is_an_encoder_spec_with_a_docstring() -> None:
    assert set(NOT_OFFLINE) | set(FAMILY_EXAMPLES) <= set(shipped())
    for name in shipped():
        spec = ENCODERS.get(name)
        assert issubclass(spec, EncoderSpec) and spec.name == name
        assert ENCODERS.describe()[name], "every entry needs a one-line docstring"
        if not name.endswith(":"):
            assert spec.config is not None and spec.config.dim, "an exact entry declares its config"


@pytest.mark.parametrize("example", offline_examples())
def test_every_offline_entry_builds(example: str) -> None:
    """Built by name from the registry: features [B, config.dim], finite; an exact entry's encoder carries the
    config the entry declares."""
    spec, arg = ENCODERS.lookup(example)
    assert not spec.name.endswith(":") or arg, f"family {spec.name} needs an offline example in FAMILY_EXAMPLES"
    enc = build_encoder(example)
    out = enc.encode(_batch(enc))
    assert out.shape == (2, enc.config.dim) and torch.isfinite(out).all()
    assert enc.preprocessing == enc.config.preprocessing() and enc.preprocessing["crop"] == enc.config.size
    if spec.config is not None:
        assert enc.config == spec.config


def test_encoder_config_is_checked_and_records_the_preprocessing() -> None:
    """The recorded form is what feature files store (an extraction resumes only under the same one): the
    configs give the dicts the encoders recorded before they declared configs."""
    from mr2probe.encoders import EncoderConfig
    from mr2probe.encoders.mocov2 import CONFIG as MOCO
    from mr2probe.encoders.onnx_models import imagenet_config
    from mr2probe.encoders.torchhub import hub_config

    imagenet = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
    assert MOCO.preprocessing() == {"resize": 256, "crop": 224, "interpolation": "bilinear", **imagenet}
    assert hub_config(384).preprocessing() == {"resize": 256, "crop": 224, "interpolation": "bicubic", **imagenet}
    assert imagenet_config(228).preprocessing()["resize"] == 261  # round(228 / 0.875), not ⌊260.57⌋
    assert ENCODERS.get("efficientnet-lite1").config.preprocessing() == {
        "resize": 274, "crop": 240, "interpolation": "bilinear", "mean": [127 / 255] * 3, "std": [128 / 255] * 3,
        "scaling": "(x - 127) / 128"}
    for bad in ({"input_size": (3, 224, 200)}, {"input_size": (1, 224, 224)}, {"interpolation": "lanczos"},
                {"crop_mode": "border"}, {"crop_pct": 0.0}, {"crop_pct": 1.5}, {"std": (0.5, 0.0, 0.5)},
                {"mean": (0.5,)}, {"dim": 0}):
        with pytest.raises(ValueError, match="EncoderConfig"):
            EncoderConfig(**bad)


@pytest.mark.parametrize("name", ["no-such-encoder", "nofamily:x", "clip:NoSuchArch/openai",
                                  "clip:ViT-B-32/no-such-tag", "clip:ViT-B-32", "clip:ViT-B-32/random@bogus",
                                  "timm:no_such_model", "timm:resnet18@bogus", "timm:resnet18.no_such_tag@random",
                                  "timm:hf-hub:no_org", "hf-hub:a/b/c", "clip:ViT-B-32,no-such-tag",
                                  "mocov2:", "onnx:/no/such/model.onnx"])
def test_unknown_names_are_user_errors(name: str) -> None:
    with pytest.raises(UserError):
        build_encoder(name)


@pytest.mark.parametrize("recipe", sorted((REPO / "extract").glob("*.toml")), ids=lambda p: p.stem)
def test_recipes_name_known_encoders(recipe: Path) -> None:
    from mr2probe.encoders import clip, timm_models

    enc = load_recipe(recipe)["encoder"]
    _, arg = ENCODERS.lookup(enc)
    if enc.startswith("clip:"):
        assert clip.parse_name(arg)[1] is not None  # a real pretrained tag
    elif enc.startswith("timm:"):
        assert timm_models.parse_name(arg) == (arg, False)
    assert tomllib.loads(recipe.read_text()).get("description")


def test_paper_recipes_exist() -> None:
    encoders = {load_recipe(p)["encoder"] for p in (REPO / "extract").glob("*.toml")}
    assert {"clip:ViT-B-16/openai", "clip:ViT-B-32/openai", "timm:vit_base_patch16_224.mae",
            "timm:vit_large_patch16_224.mae", "timm:vit_base_patch16_224.augreg_in21k_ft_in1k",
            "efficientnet-lite0", "efficientnet-lite1", "efficientnet-lite2", "dinov2-s14"} <= encoders
    assert any(e.startswith("mocov2:") for e in encoders)


# ---------------------------------------------------------------- bundled-weight entries


@pytest.mark.parametrize("name", [n for n in ENCODERS.names() if n.startswith("efficientnet-lite")])
def test_efficientnet_lite_dims(name: str) -> None:
    enc = build_encoder(name)
    out = enc.encode(_batch(enc))
    assert out.shape == (2, 1280) and torch.isfinite(out).all()
    assert enc.weights_sha256


@pytest.fixture(scope="module")
def dinov2() -> Encoder:
    return build_encoder("dinov2-s14")


def test_dinov2_real_images(dinov2: Encoder) -> None:
    assert dinov2.dim == 384 and dinov2.preprocessing["interpolation"] == "bicubic"
    dog, chair = _image("imagenet_00_243.jpg"), _image("imagenet_01_559.jpg")
    w, h = dog.size
    crops = [dog.crop((0, 0, int(0.85 * w), int(0.85 * h))), dog.crop((int(0.15 * w), int(0.15 * h), w, h))]
    x = torch.stack([dinov2.transform(im) for im in (*crops, chair)])
    f = dinov2.encode(x)
    assert f.shape == (3, 384) and torch.isfinite(f).all()
    same, different = _cos_dist(f[0], f[1]), min(_cos_dist(f[0], f[2]), _cos_dist(f[1], f[2]))
    assert same < different, (same, different)


def test_dinov2_missing_file_is_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError):
        build_encoder("dinov2-s14", tmp_path / "absent.onnx")


# ---------------------------------------------------------------- clip


@pytest.fixture(scope="module")
def clip_random() -> Encoder:
    return build_encoder("clip:ViT-B-32/random")


def test_clip_random_dim_and_preprocessing(clip_random: Encoder) -> None:
    out = clip_random.encode(_batch(clip_random))
    assert clip_random.dim == 512 and out.shape == (2, 512) and torch.isfinite(out).all()
    pre = clip_random.preprocessing
    assert (pre["resize"], pre["crop"], pre["interpolation"]) == (224, 224, "bicubic")
    assert pre["mean"] == pytest.approx([0.48145466, 0.4578275, 0.40821073])
    assert clip_random.weights_sha256 is None


def test_clip_weights_file_preproj_and_quickgelu(clip_random: Encoder, tmp_path: Path) -> None:
    """--weights: a visual-tower state dict loads into the tag's architecture (OpenAI: QuickGELU); @preproj gives
    the 768-d pooled features whose projection is the 512-d embedding."""
    import open_clip

    visual = {f"visual.{k}": v for k, v in clip_random.module.model.visual.state_dict().items()}
    path = tmp_path / "vit-b-32-visual.pt"
    torch.save(visual, path)
    enc = build_encoder("clip:ViT-B-32/openai@preproj", path)
    assert enc.dim == 768 and enc.weights_sha256 == sha256_file(path)
    model = enc.module.model
    assert any(isinstance(m, open_clip.transformer.QuickGELU) for m in model.visual.modules())
    loaded = model.visual.state_dict()
    assert all(torch.equal(loaded[k[len("visual."):]], v) for k, v in visual.items() if k != "visual.proj")
    x = _batch(enc)
    pre = enc.encode(x)
    assert pre.shape == (2, 768)
    model.visual.proj = torch.nn.Parameter(visual["visual.proj"])
    full = enc.encode(x)
    assert _rel_err(pre @ visual["visual.proj"], full) < 1e-5


def test_clip_weights_mismatch_is_user_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.pt"
    torch.save({"visual.conv1.weight": torch.zeros(3)}, path)
    with pytest.raises(UserError, match="does not match"):
        build_encoder("clip:ViT-B-32/random", path)


def test_clip_preprocessing_modes() -> None:
    from mr2probe.encoders.clip import config_of

    cfg = {"size": 256, "mean": (0.5,) * 3, "std": (0.5,) * 3, "interpolation": "bilinear"}
    assert config_of({**cfg, "resize_mode": "shortest"}).preprocessing()["resize"] == 256
    squash = config_of({**cfg, "size": (256, 256), "resize_mode": "squash"}).preprocessing()
    assert (squash["resize"], squash["crop"], squash["resize_mode"]) == ([256, 256], 256, "squash")
    with pytest.raises(UserError):
        config_of({**cfg, "resize_mode": "longest"})


# ---------------------------------------------------------------- timm


def test_timm_mae_name_random() -> None:
    enc = build_encoder("timm:vit_base_patch16_224.mae@random")
    out = enc.encode(_batch(enc))
    assert enc.dim == 768 and out.shape == (2, 768) and torch.isfinite(out).all()
    assert (enc.preprocessing["resize"], enc.preprocessing["crop"]) == (248, 224)  # crop_pct 0.9


def test_random_weights_are_reproducible() -> None:
    a, b = build_encoder("timm:resnet18@random"), build_encoder("timm:resnet18@random")
    x = _batch(a)
    assert torch.equal(a.encode(x), b.encode(x))


def test_timm_weights_file(tmp_path: Path) -> None:
    """A timm state dict with its classifier loads into the pooled model: features = the net's pre-logits."""
    import timm

    torch.manual_seed(0)
    net = timm.create_model("resnet18", pretrained=False).eval()
    path = tmp_path / "resnet18.pth"
    torch.save({"state_dict": net.state_dict()}, path)
    enc = build_encoder("timm:resnet18", path)
    assert enc.dim == 512 and enc.weights_sha256 == sha256_file(path)
    x = _batch(enc)
    with torch.inference_mode():
        ref = net.forward_head(net.forward_features(x), pre_logits=True)
    assert _rel_err(enc.encode(x), ref) < 1e-6


def test_timm_preprocessing_modes() -> None:
    from mr2probe.encoders.timm_models import config_of

    cfg = {"input_size": (3, 224, 224), "interpolation": "bicubic", "mean": (0.5,) * 3, "std": (0.5,) * 3}
    assert config_of({**cfg, "crop_pct": 0.875, "crop_mode": "center"}).preprocessing()["resize"] == 256
    assert config_of({**cfg, "crop_pct": 1.0, "crop_mode": "squash"}).preprocessing()["resize"] == [224, 224]
    assert config_of({**cfg, "crop_pct": 0.9}).preprocessing()["resize"] == 248  # ⌊224 / 0.9⌋
    with pytest.raises(UserError):
        config_of({**cfg, "crop_pct": 1.0, "crop_mode": "border"})


# ---------------------------------------------------------------- MoCo v2


def _resnet50_state(seed: int = 0) -> dict[str, torch.Tensor]:
    from torchvision.models import resnet50

    torch.manual_seed(seed)
    return resnet50(weights=None).state_dict()


def test_mocov2_checkpoint_matches_plain_resnet50(tmp_path: Path) -> None:
    from torchvision.models import resnet50

    state = _resnet50_state()
    backbone = {f"module.encoder_q.{k}": v for k, v in state.items() if not k.startswith("fc.")}
    head = {"module.encoder_q.fc.0.weight": torch.randn(2048, 2048), "module.encoder_q.fc.0.bias": torch.zeros(2048),
            "module.encoder_q.fc.2.weight": torch.randn(128, 2048), "module.encoder_q.fc.2.bias": torch.zeros(128)}
    ckpt = {"epoch": 800, "arch": "resnet50", "state_dict": {**backbone, **head, "module.queue": torch.randn(128, 8),
                                                             "module.queue_ptr": torch.zeros(1, dtype=torch.long)}}
    path = tmp_path / "moco_v2.pth.tar"
    torch.save(ckpt, path)
    enc = build_encoder(f"mocov2:{path}")
    assert enc.dim == 2048 and enc.weights_sha256 == sha256_file(path)
    assert (enc.preprocessing["resize"], enc.preprocessing["crop"]) == (256, 224)
    ref = resnet50(weights=None)
    ref.load_state_dict(state)
    ref.fc = torch.nn.Identity()
    x = _batch(enc)
    with torch.inference_mode():
        expected = ref.eval()(x)
    assert torch.allclose(enc.encode(x), expected, rtol=1e-5, atol=1e-6)


def test_mocov2_wrong_keys_refused(tmp_path: Path) -> None:
    path = tmp_path / "supervised.pth"
    torch.save({"state_dict": {"conv1.weight": torch.zeros(64, 3, 7, 7)}}, path)
    with pytest.raises(UserError, match="not a MoCo checkpoint"):
        build_encoder(f"mocov2:{path}")
    path = tmp_path / "partial_q.pth"
    torch.save({"state_dict": {"module.encoder_q.conv1.weight": torch.zeros(64, 3, 7, 7)}}, path)
    with pytest.raises(UserError, match="not a ResNet-50"):
        build_encoder(f"mocov2:{path}")


def test_mocov2_corrupt_file_refused(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.pth.tar"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(UserError):
        build_encoder(f"mocov2:{path}")


class _CreatesFile:
    """Unpickling this calls open(target, "w"): a stand-in for code hidden in a checkpoint."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> tuple:
        return open, (str(self.target), "w")


def test_mocov2_pickled_code_refused(tmp_path: Path) -> None:
    target = tmp_path / "pwned"
    path = tmp_path / "evil.pth.tar"
    torch.save({"state_dict": {"module.encoder_q.conv1.weight": torch.zeros(1)}, "x": _CreatesFile(target)}, path)
    with pytest.raises(UserError, match="refusing"):
        build_encoder(f"mocov2:{path}")
    assert not target.exists()
    torch.load(path, weights_only=False)  # the payload is live: a plain unpickle runs it
    assert target.exists()


# ---------------------------------------------------------------- ONNX


class _Tokens(torch.nn.Module):
    """A toy ViT-like encoder: patches → [B, T, C] tokens (token 0 = mean token)."""

    def __init__(self) -> None:
        super().__init__()
        self.patch = torch.nn.Conv2d(3, 16, 32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.patch(x).flatten(2).transpose(1, 2)
        return torch.cat([t.mean(1, keepdim=True), t], dim=1)


def test_onnx_family(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = _Tokens().eval()
    path = tmp_path / "toy.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter, as the CPU runtime uses
        torch.onnx.export(net, torch.zeros(1, 3, 224, 224), str(path), input_names=["x"],
                          dynamic_axes={"x": {0: "b"}}, dynamo=False)
    enc = build_encoder(f"onnx:{path}")
    assert enc.dim == 16 and (enc.preprocessing["resize"], enc.preprocessing["crop"]) == (256, 224)
    x = _batch(enc)
    with torch.inference_mode():
        ref = net(x)[:, 0]
    assert _rel_err(enc.encode(x), ref) < 1e-5
    with pytest.raises(UserError):
        build_encoder(f"onnx:{path}", path)
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(UserError):
        build_encoder(f"onnx:{bad}")


def test_cpu_runtime_matches_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MR2PROBE_CACHE", str(tmp_path))
    enc = build_encoder("efficientnet-lite0")
    x = enc.transform(_image("imagenet_02_438.jpg")).unsqueeze(0)
    fast = cpu_runtime(enc, "onnx")
    assert fast is not enc and fast.dim == enc.dim and fast.preprocessing["runtime"] == "onnxruntime"
    assert _rel_err(fast.encode(x), enc.encode(x)) < 1e-4


# ---------------------------------------------------------------- ecosystem names (loaders patched: no network)


def _timm_random(name: str = "vit_tiny_patch16_224", **kw) -> torch.nn.Module:
    from timm.models import create_model  # timm's own, not a patched timm.create_model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return create_model(name, pretrained=False, num_classes=0, **kw)


@pytest.mark.parametrize("name", ["timm:hf-hub:timm/vit_tiny_patch16_224.augreg_in21k",
                                  "hf-hub:timm/vit_tiny_patch16_224.augreg_in21k"])
def test_timm_hf_hub_names_reach_timm(name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import timm

    calls = []

    def create_model(model_name: str, pretrained: bool = False, **kw) -> torch.nn.Module:
        calls.append((model_name, pretrained, kw))
        return _timm_random()

    monkeypatch.setattr(timm, "create_model", create_model)
    enc = build_encoder(name)
    assert calls == [("hf-hub:timm/vit_tiny_patch16_224.augreg_in21k", True, {"num_classes": 0})]
    assert enc.name == name and enc.dim == 192 and enc.encode(_batch(enc)).shape == (2, 192)
    path = tmp_path / "w.pt"
    torch.save(_timm_random().state_dict(), path)
    assert build_encoder(name, path).weights_sha256 == sha256_file(path) and calls[-1][1] is False
    assert build_encoder(name, pool="cls+avg", blocks=2).dim == 4 * 192  # the readout applies to hub ViTs too


def test_clip_model_pretrained_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    import open_clip

    from mr2probe.encoders import clip

    assert clip.parse_name("ViT-B-32,laion2b_s34b_b79k") == clip.parse_name("ViT-B-32/laion2b_s34b_b79k") \
        == ("ViT-B-32", "laion2b_s34b_b79k", False)
    assert clip.parse_name("ViT-B-16,openai@preproj") == ("ViT-B-16", "openai", True)
    real, calls = open_clip.create_model, []

    def create_model(arch: str, pretrained: str | None = None, **kw) -> torch.nn.Module:
        calls.append((arch, pretrained, kw["force_quick_gelu"]))
        return real("ViT-S-32-alt", pretrained=None)

    monkeypatch.setattr(open_clip, "create_model", create_model)
    enc = build_encoder("clip:ViT-B-32,laion2b_s34b_b79k")
    assert calls == [("ViT-B-32", "laion2b_s34b_b79k", False)] and enc.name == "clip:ViT-B-32,laion2b_s34b_b79k"
    build_encoder("clip:ViT-B-32,openai")
    assert calls[-1] == ("ViT-B-32", "openai", True)  # OpenAI's tags are built with QuickGELU
    monkeypatch.setattr(open_clip, "create_model", real)
    assert build_encoder("clip:ViT-S-32-alt,random").dim == 256  # offline: random weights, as with /random


@pytest.mark.parametrize("name", ["dinov2_vitb14", "dinov2_vits14_reg"])
def test_dinov2_hub_names(name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls = []

    def hub_load(repo: str, model: str, **kw) -> torch.nn.Module:
        calls.append((repo, model, kw["pretrained"]))
        return _timm_random("vit_small_patch14_dinov2", img_size=224)  # the same ViT-S/14, random, offline

    monkeypatch.setattr(torch.hub, "load", hub_load)
    enc = build_encoder(name)
    assert calls == [("facebookresearch/dinov2", name, True)]
    assert enc.name == name and enc.dim == 384 and enc.encode(_batch(enc)).shape == (2, 384)
    pre = enc.preprocessing
    assert (pre["resize"], pre["crop"], pre["interpolation"]) == (256, 224, "bicubic")
    path = tmp_path / "w.pt"
    torch.save(_timm_random("vit_small_patch14_dinov2", img_size=224).state_dict(), path)
    loaded = build_encoder(name, path)
    assert calls[-1][2] is False and loaded.weights_sha256 == sha256_file(path)

    def offline(repo: str, model: str, **kw) -> torch.nn.Module:
        raise OSError("<urlopen error [Errno -2] Name or service not known>\nmore")

    monkeypatch.setattr(torch.hub, "load", offline)
    with pytest.raises(UserError, match="cannot load .* from torch hub facebookresearch/dinov2") as e:
        build_encoder(name)
    assert "\n" not in str(e.value)


def test_dinov2_hub_names_are_registered() -> None:
    assert set(HUB_DINOV2) <= set(ENCODERS.names()) and len(HUB_DINOV2) == 8
