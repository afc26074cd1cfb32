#!/bin/bash
# Re-renders every committed run folder with the current protocol from its saved results.json and
# predictions.npz, without training: groups ranked on the reference's val accuracy, sample SD (ddof = 1),
# bootstrap CIs of the seed mean, the null-control line (these runs were trained before the null control
# existed, so their tables say so), the grid-edge line; the later folders (settings, dose, adapter) likewise.
# Run from the repository root with mr2probe installed.
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
M=results/mnist-effl0-settings
mr2probe report $M/linear-longtail100 $M/linear-shots5 $M/linear-longtail10 $M/linear-shots20 --html > /dev/null
for R in $S $M; do  # the cosine settings cells that exist, each alone and beside its linear cell
  for cell in longtail100 longtail10 shots20 shots5; do
    [ -f $R/cosine-$cell/results.json ] || continue
    mr2probe report $R/cosine-$cell --html > /dev/null
    mr2probe report $R/linear-$cell $R/cosine-$cell --summary $R/cosine-vs-linear-$cell.md > /dev/null
  done
done
D=results/fmnist-effl0-dose  # in the order of its run.sh
dirs=()
for tag in longtail100 shots5 full; do
  for arm in linear-e0.33-p3 linear-e1 linear-e3 linear-p2 linear-p5 cosine-classifier cosine-input; do
    dirs+=("$D/$tag-$arm")
  done
done
mr2probe report "${dirs[@]}" > /dev/null
A=results/fmnist-effl0-adapter
mr2probe report $A/shots20-linear $A/shots20-linear-refscale $A/shots20-mlp $A/shots20-mlp-refscale > /dev/null
