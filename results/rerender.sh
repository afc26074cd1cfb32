#!/bin/bash
# Re-renders every committed run folder with the current protocol from its saved results.json and
# predictions.npz, without training: groups ranked on the reference's val accuracy, sample SD (ddof = 1),
# bootstrap CIs of the seed mean, the null-control line (these runs were trained before the null control
# existed, so their tables say so). Run from the repository root with mr2probe installed.
set -euo pipefail
export OMP_NUM_THREADS=1
mr2probe bench benchmarks/offline.toml --out results/offline --report-only -q
mr2probe report results/fmnist-effl0/linear results/fmnist-effl0/cosine results/fmnist-effl0/linear-adapter \
  results/fmnist-effl0/cosine-adapter --html > /dev/null
mr2probe report results/mnist-effl0/linear results/mnist-effl0/cosine --html > /dev/null
mr2probe report results/fmnist-dinov2s14/linear results/fmnist-dinov2s14/cosine --html > /dev/null
mr2probe report results/fmnist-effl0-protocol/linear results/fmnist-effl0-protocol/cosine --html > /dev/null
S=results/fmnist-effl0-settings
mr2probe report $S/linear-longtail100 $S/linear-shots5 $S/linear-longtail10 $S/linear-shots20 --html > /dev/null
