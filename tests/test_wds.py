"""WebDataset tar shards (``--dataset wds:SPEC``), offline: shards written here from foolbox's real sample images
(JPEG and PNG), read back by key with their labels, pattern expansion, class names from integers, a classes file
or label text, extraction end to end, and bad shards as one-line errors."""
from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

from mr2probe.datasets import build_dataset
from mr2probe.datasets.wds import expand_braces, parse_spec
from mr2probe.errors import UserError
from test_datasets import needs_samples, rgb, samples

pytestmark = needs_samples


def write_shard(path: Path, items: list[tuple[str, Path, str]], extra: bool = True) -> None:
    """A WebDataset shard: per (key, image file, label text) the members KEY.<ext> and KEY.cls (and a KEY.json)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for key, image, label in items:
            members = [(f"{key}{image.suffix.lower()}", image.read_bytes()), (f"{key}.cls", label.encode())]
            if extra:
                members.append((f"{key}.json", b'{"source": "foolbox"}'))
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def imagenet_shards(root: Path, per_shard: int = 3) -> dict[str, list[tuple[Path, int]]]:
    """foolbox's 20 ImageNet JPEGs: 12 train in 4 shards, 6 test in 2, 2 val in 1, labelled by their class index
    mod 3 (three classes), keys running across shards."""
    items = [(p, label % 3) for p, label in samples("imagenet")]
    parts = {"train": items[:12], "test": items[12:18], "val": items[18:]}
    for split, part in parts.items():
        for s in range(0, len(part), per_shard):
            chunk = part[s:s + per_shard]
            write_shard(root / f"{split}-{s // per_shard:06d}.tar",
                        [(f"{split}{s + j:05d}", p, str(label)) for j, (p, label) in enumerate(chunk)])
    return parts


def test_braces_and_spec() -> None:
    assert expand_braces("s/train-{000..002}.tar") == ["s/train-000.tar", "s/train-001.tar", "s/train-002.tar"]
    assert expand_braces("{a,b}-{8..10}.tar") == ["a-8.tar", "a-9.tar", "a-10.tar", "b-8.tar", "b-9.tar", "b-10.tar"]
    patterns, options, optional = parse_spec("train=s/tr-{0..3}.tar,test=s/te-{a,b}.tar,label=txt")
    assert patterns == {"train": "s/tr-{0..3}.tar", "test": "s/te-{a,b}.tar"} and options == {"label": "txt"}
    assert not optional
    patterns, _, optional = parse_spec("s/{split}-{0..1}.tar")
    assert patterns["val"] == "s/val-{0..1}.tar" and optional
    for bad in ("s/no-split-{0..1}.tar", "bogus=x.tar", "train=,test=b.tar"):
        with pytest.raises(UserError):
            parse_spec(bad)


@pytest.mark.parametrize("spec", ["train=train-{000000..000003}.tar,test=test-{000000..000001}.tar,"
                                  "val=val-000000.tar", "{split}-*.tar", ""])
def test_shards_read_back(tmp_path: Path, spec: str) -> None:
    parts = imagenet_shards(tmp_path)
    data = build_dataset(f"wds:{spec}", tmp_path)
    assert data.class_names == ["0", "1", "2"] and set(data.splits) == {"train", "val", "test"}
    for split, part in parts.items():
        sp = data.splits[split]
        assert list(sp.labels) == [label for _, label in part]
        for i in (0, len(part) - 1):
            assert sp.raw(i) == part[i][0].read_bytes()  # the member's bytes, read by offset
            assert np.array_equal(np.asarray(sp.image(i)), rgb(part[i][0]))
            assert np.array_equal(sp.pixels(i).permute(1, 2, 0).numpy(), rgb(part[i][0]))
    assert "4 shards" in data.source


def test_png_label_text_and_classes_file(tmp_path: Path) -> None:
    pngs = samples("cifar10")[:6]
    write_shard(tmp_path / "train-0.tar", [(f"k{i}", p, f"c{label}") for i, (p, label) in enumerate(pngs[:4])],
                extra=False)
    write_shard(tmp_path / "test-0.tar", [(f"k{i}", p, f"c{label}") for i, (p, label) in enumerate(pngs[:2])])
    data = build_dataset("wds:", tmp_path)  # --root's {split}-*.tar; no val shards: no val split
    names = sorted({f"c{label}" for _, label in pngs[:4]})
    assert data.class_names == names and set(data.splits) == {"train", "test"}
    assert [data.class_names[c] for c in data.splits["train"].labels] == [f"c{label}" for _, label in pngs[:4]]
    assert np.array_equal(np.asarray(data.splits["test"].image(1)), rgb(pngs[1][0]))
    # integer labels with a classes file
    imagenet_shards(tmp_path / "in")
    (tmp_path / "in" / "classes.txt").write_text("cat\ndog\nbird\nfish\n")
    data = build_dataset("wds:{split}-*.tar,classes=classes.txt", tmp_path / "in")
    assert data.class_names == ["cat", "dog", "bird", "fish"]


def test_extraction_from_shards(tmp_path: Path) -> None:
    import _extract_support as support  # registers the tiny test encoder
    from mr2probe.extract import ExtractConfig, extract
    from mr2probe.featurestore import read_features

    parts = imagenet_shards(tmp_path / "shards")
    out = extract(ExtractConfig(encoder=support.NAME, dataset="wds:{split}-*.tar", root=tmp_path / "shards",
                                out=tmp_path / "f.h5", workers=1, batch_size=4, progress=False, runtime="torch"))
    fs = read_features(out)
    assert {s: len(fs.splits[s].labels) for s in ("train", "val", "test")} == {s: len(p) for s, p in parts.items()}
    assert list(fs.splits["test"].labels) == [label for _, label in parts["test"]]
    assert "WebDataset tar shards" in fs.attrs["source"]


def test_bad_shards_are_one_line_errors(tmp_path: Path) -> None:
    imagenet_shards(tmp_path)
    (tmp_path / "bad-0.tar").write_bytes(b"not a tar file" * 100)
    jpg = samples("imagenet")[0][0]
    with tarfile.open(tmp_path / "nolabel-0.tar", "w") as tar:
        tar.add(jpg, arcname="k0.jpg")
    cases = {"train=train-{000000..000009}.tar,test=test-*.tar": "not found",
             "train=train-*.tar": "no test= shards",
             "train=train-*.tar,test=absent-*.tar": "no shards match",
             "train=bad-0.tar,test=test-*.tar": "cannot read shard",
             "{split}-{000000..000001}.tar": "val-000001.tar not found",
             "train=nolabel-0.tar,test=test-*.tar": "lacks a .cls label file",
             "train=train-*.tar,test=test-*.tar,classes=absent.txt": "classes file",
             "train=train-*.tar,test=test-*.tar,image=png": "lacks an image (png)"}
    for spec, says in cases.items():
        with pytest.raises(UserError) as e:
            build_dataset(f"wds:{spec}", tmp_path)
        assert "\n" not in str(e.value) and says in str(e.value), (spec, str(e.value))


def test_default_output_name_stays_in_features() -> None:
    from mr2probe.extract import default_out

    out = default_out("wds:shards/{split}-{000000..000003}.tar", "clip:ViT-B-32/openai", "avg", 4)
    assert out.parent == Path("features")
    assert out.name == "wds:shards_{split}-{000000..000003}.tar-clip_ViT-B-32_openai-avg-b4.h5"
