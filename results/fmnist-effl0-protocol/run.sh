#!/bin/bash
# The reference under the current protocol on full Fashion-MNIST × EfficientNet-Lite0 (60k/10k, real ImageNet
# weights): CE with the linear head and CE + JTT with the cosine head whose scale is selected on val
# ({8, 16, …, 256} × lr × wd; {8, …, 64} before session 7), 3 seeds + the null control (3 more CE seeds), groups ranked on val.
# Run from the repository root with mr2probe installed; resumable (finished seeds are kept in parts/).
set -euo pipefail
export OMP_NUM_THREADS=1
F=features/fmnist-effl0.h5
[ -f $F ] || mr2probe extract --encoder efficientnet-lite0 --dataset fashion-mnist --out $F
mr2probe train --features $F --methods ce --head linear --seeds 3 --out results/fmnist-effl0-protocol/linear -q
mr2probe train --features $F --methods ce,jtt --head cosine --seeds 3 --out results/fmnist-effl0-protocol/cosine -q
mr2probe report results/fmnist-effl0-protocol/linear results/fmnist-effl0-protocol/cosine --html
