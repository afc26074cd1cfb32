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
for R in results/fmnist-effl0-settings results/mnist-effl0-settings results/fmnist-dinov2s14-500-settings \
         results/mnist-dinov2s14-500-settings; do
  [ -f $R/linear-shots20/results.json ] || continue
  full=(); [ -f $R/linear-full/results.json ] && full=($R/linear-full)  # the balanced cell (session 11)
  mr2probe report $R/linear-longtail100 $R/linear-shots5 $R/linear-longtail10 $R/linear-shots20 "${full[@]}" \
    --html > /dev/null
  for d in $R/linear-*-steps4000 $R/linear-*-lr3; do  # the reference diagnostics that exist
    [ -f $d/results.json ] && mr2probe report $d --html > /dev/null
  done
  for cell in longtail100 shots5 longtail10 shots20 full; do  # the cells retrained under --budget-rule reach-logreg
    [ -f $R/linear-$cell-reach/results.json ] || continue
    mr2probe report $R/linear-$cell-reach --html > /dev/null
    mr2probe report $R/linear-$cell $R/linear-$cell-reach --summary $R/reach-vs-floor-$cell.md > /dev/null
  done
  for cell in longtail100 longtail10 shots20 shots5 full; do  # the cosine cells that exist, alone and beside the linear
    [ -f $R/cosine-$cell/results.json ] || continue
    mr2probe report $R/cosine-$cell --html > /dev/null
    mr2probe report $R/linear-$cell $R/cosine-$cell --summary $R/cosine-vs-linear-$cell.md > /dev/null
    [ -f $R/cosine-$cell-ldam-headscale/results.json ] || continue
    mr2probe report $R/cosine-$cell-ldam-headscale --html > /dev/null
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
adirs=()
for cell in shots20 full; do  # the adapter cells that exist
  for arm in linear linear-refscale mlp mlp-refscale; do
    [ -f $A/$cell-$arm/results.json ] && adirs+=("$A/$cell-$arm")
  done
done
mr2probe report "${adirs[@]}" > /dev/null
