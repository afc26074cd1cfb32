#!/bin/bash
# The four settings cells of results/fmnist-effl0-settings/ (long-tailed ρ = 100 and 10, 5 and 20 shots × 5
# episodes; every method without an adapter + logreg + knn, linear head, 3 seeds, null control, groups on val) on
# full MNIST × EfficientNet-Lite0 features (extracted first if missing: MNIST from scripts/fetch-mnist.sh).
# Resumable. Run from the repository root.
set -euo pipefail
DATASET=mnist ENCODER=efficientnet-lite0 F=features/mnist-effl0.h5 R=results/mnist-effl0-settings \
  exec bash results/fmnist-effl0-settings/run.sh
