#!/bin/bash
# Settings where probe losses can differ (issue "Settings where methods can differ"), on full Fashion-MNIST ×
# EfficientNet-Lite0 features: long-tailed training sets (ρ = 100, 10), few-shot ones (5 and 20 per class,
# 5 episodes) and the balanced full training set (linear head only), every method without an adapter + the reference probes logreg and knn, linear head, 3 seeds,
# null control, groups on val. Val and test are the full balanced splits. Run from the repository root;
# resumable (finished seeds are kept in each run folder's parts/). Cells are run in this order and each is
# reported as soon as it is done. Another dataset or encoder: set DATASET, ENCODER, F and R (as
# results/mnist-effl0-settings/run.sh does); HEADS=linear runs the linear cells only.
set -euo pipefail
export OMP_NUM_THREADS=1
DATASET=${DATASET:-fashion-mnist}
ENCODER=${ENCODER:-efficientnet-lite0}
F=${F:-features/fmnist-effl0.h5}
R=${R:-results/fmnist-effl0-settings}
# resumes a .partial; EXTRACT_ARGS adds extraction flags (e.g. --per-class 500 for a stratified subset)
[ -f $F ] || mr2probe extract --recipe extract/$ENCODER.toml --dataset $DATASET ${EXTRACT_ARGS:-} --out $F
M="all,logreg,knn"
# A cell whose folder holds results.json is finished and is not trained again: parts/ are not in git, and features
# extracted on another CPU model differ in their last bits (another content hash, so `train` itself would start
# over), though the committed heads predict the same test labels on them (README, Determinism). Delete a cell's
# results.json to retrain it.
run_cell() {  # run_cell OUT TRAIN-ARGS...
  local out=$1; shift
  if [ -f "$out/results.json" ]; then echo "finished: $out"; else mr2probe train "$@" --out "$out" -q; fi
}
run_cell $R/linear-longtail100 --features $F --methods $M --head linear --seeds 3 --train-profile longtail:100
run_cell $R/linear-shots5 --features $F --methods $M --head linear --seeds 3 --train-profile shots:5 --episodes 5
run_cell $R/linear-longtail10 --features $F --methods $M --head linear --seeds 3 --train-profile longtail:10
run_cell $R/linear-shots20 --features $F --methods $M --head linear --seeds 3 --train-profile shots:20 --episodes 5
# The balanced cell (session 11): the whole training set (54,000 rows on the full files, 4,500 on the 500-per-class
# DINOv2-S subsets), as the offline suite has it but under this round's protocol and baselines, with the null
# control and the reference probes.
run_cell $R/linear-full --features $F --methods $M --head linear --seeds 3
mr2probe report $R/linear-longtail100 $R/linear-shots5 $R/linear-longtail10 $R/linear-shots20 $R/linear-full \
  --html > /dev/null
# Budget check (session 9): the reference check flagged CE below logreg by > 0.5 point at ρ = 100 on MNIST ×
# EfficientNet-Lite0 and Fashion-MNIST × DINOv2-S; CE and logreg again with 4× the step floor.
run_cell $R/linear-longtail100-steps4000 --features $F --methods ce,logreg --head linear --seeds 3 \
  --train-profile longtail:100 --min-steps 4000
mr2probe report $R/linear-longtail100-steps4000 --html > /dev/null
# The reach-logreg budget rule (session 10): every linear cell whose reference check says the reference may be
# under-fit (CE more than 0.5 point below logreg on All) is trained again, every method, with
# --budget-rule reach-logreg (min_steps doubled from the floor until CE's val score is within 0.5 point of logreg's,
# up to 32,000 steps; the same budget for every method), in linear-CELL-reach, and compared with the floor-rule cell
# in reach-vs-floor-CELL.*.
for cell in longtail100 shots5 longtail10 shots20 full; do
  grep -q "may be under-fit" $R/linear-$cell/table.md || continue
  case $cell in
    longtail*) P="--train-profile longtail:${cell#longtail}" ;;
    shots*) P="--train-profile shots:${cell#shots} --episodes 5" ;;
    full) P="" ;;
  esac
  run_cell $R/linear-$cell-reach --features $F --methods $M --head linear --seeds 3 $P --budget-rule reach-logreg
  mr2probe report $R/linear-$cell-reach --html > /dev/null
  mr2probe report $R/linear-$cell $R/linear-$cell-reach --summary $R/reach-vs-floor-$cell.md > /dev/null
done
# HEADS=linear stops here (the cosine cells below take several times as long)
[[ " ${HEADS:-linear cosine} " == *" cosine "* ]] || exit 0
# The cosine head (scale grid on val), every method without an adapter (logreg and knn do not depend on the head:
# their rows are the linear cells'), in this order; each cell beside its linear one in cosine-vs-linear-CELL.*.
# The few-shot cosine cells run 1 seed × 5 episodes (5 replicates, not 15): the six-point scale grid makes a
# replicate about 6 min on one core, and the episode draw, not the seed, is most of a few-shot cell's spread.
# COSINE_CELLS adds the balanced cell "full" where it is affordable (the 500-per-class DINOv2-S subsets; on the full
# 54,000-row files the scale grid makes it about 3 h of one core per dataset).
for cell in ${COSINE_CELLS:-longtail100 longtail10 shots20 shots5}; do
  case $cell in
    longtail*) P="--seeds 3 --train-profile longtail:${cell#longtail}" ;;
    shots*) P="--seeds 1 --train-profile shots:${cell#shots} --episodes 5" ;;
    full) P="--seeds 3" ;;
  esac
  run_cell $R/cosine-$cell --features $F --methods all --head cosine $P
  mr2probe report $R/cosine-$cell --html > /dev/null
  mr2probe report $R/linear-$cell $R/cosine-$cell --summary $R/cosine-vs-linear-$cell.md > /dev/null
done
# LDAM on the cosine head at the head's own scale (--set ldam.s=head: s chosen on val from the scale grid like
# every method's) instead of the paper's fixed s = 30, beside CE, on every cosine cell; each reported on its own
# (its Δ is LDAM − CE within the run).
for cell in longtail100 longtail10 shots20 shots5; do
  case $cell in
    longtail*) P="--seeds 3 --train-profile longtail:${cell#longtail}" ;;
    shots*) P="--seeds 1 --train-profile shots:${cell#shots} --episodes 5" ;;
  esac
  run_cell $R/cosine-$cell-ldam-headscale --features $F --methods ce,ldam --head cosine $P --set ldam.s=head
  mr2probe report $R/cosine-$cell-ldam-headscale --html > /dev/null
done
