#!/bin/bash
# Exact commands that produced results/fmnist-effl0/ (run from the repository root, with mr2probe installed).
# OMP_NUM_THREADS=1: these runs shared a 2-core machine with other jobs; one thread per process avoids
# thread oversubscription (it changes speed only, not results on CPU beyond float summation order).
set -euo pipefail
export OMP_NUM_THREADS=1
F=features/fmnist-effl0.h5
# The feature file (full Fashion-MNIST, 60k train / 10k test, EfficientNet-Lite0 real ImageNet weights):
[ -f $F ] || mr2probe extract --encoder efficientnet-lite0 --dataset fashion-mnist --out $F
# Frozen features, no adapter: every method (supcon needs an adapter), linear and cosine heads, 3 seeds,
# default grid (lr {1e-3,1e-2} x wd {1e-4,1e-1} + each method's own grid), 30 epochs
mr2probe train --features $F --methods all --head linear --seeds 3 --out results/fmnist-effl0/linear -q
mr2probe train --features $F --methods all --head cosine --seeds 3 --out results/fmnist-effl0/cosine -q
# Trainable linear adapter (width 128, 10 epochs, lr x wd grid only, to fit the CPU budget):
# CE vs MR2 (both MR2 terms active) and SupCon
A="--adapter linear --width 128 --epochs 10 --no-method-grid"
mr2probe train --features $F --methods ce,mr2,supcon --head linear $A --seeds 3 --out results/fmnist-effl0/linear-adapter -q
mr2probe train --features $F --methods ce,mr2,supcon --head cosine $A --seeds 3 --out results/fmnist-effl0/cosine-adapter -q
