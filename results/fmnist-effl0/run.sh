#!/bin/bash
# Exact commands that produced results/fmnist-effl0/ (run from the repository root).
set -euo pipefail
F=features/fmnist-effl0.h5
# The feature file (full Fashion-MNIST, 60k train / 10k test, EfficientNet-Lite0 real ImageNet weights):
[ -f $F ] || mr2probe extract --encoder efficientnet-lite0 --dataset fashion-mnist --out $F
# Frozen features, no adapter: every method, linear and cosine heads, 3 seeds
mr2probe train --features $F --methods all --head linear --seeds 3 --out results/fmnist-effl0/linear -q
mr2probe train --features $F --methods all --head cosine --seeds 3 --out results/fmnist-effl0/cosine -q
# Trainable linear adapter (width 256): CE vs MR2 (both MR2 terms active) and SupCon
mr2probe train --features $F --methods ce,mr2,supcon --head linear --adapter linear --seeds 3 --out results/fmnist-effl0/linear-adapter -q
mr2probe train --features $F --methods ce,mr2,supcon --head cosine --adapter linear --seeds 3 --out results/fmnist-effl0/cosine-adapter -q
