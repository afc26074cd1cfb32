#!/bin/bash
# A trainable adapter (issue "Settings where methods can differ", §4) on full Fashion-MNIST × EfficientNet-Lite0
# features, two cells: few-shot (20 training images per class, 3 episodes × 1 seed) and balanced (the full training
# set), each with the null control, linear head, linear and MLP adapters of width 128: CE, MR2 with mr2probe's
# representation scale (λ chosen on val over {0.01, 0.1, 1, 10}), MR2 with the reference code's scale (λ on val
# likewise), mr2_no_rep, SupCon. c̄ is fixed at 1 (its grid {1, 2} left out to halve the MR2 stacks on 2 CPU
# cores). The balanced cell has one seed with the linear adapter and three with the MLP adapter (session 11: its
# one-seed MR2 gain sat at the MDE). Resumable (parts/ in each folder).
set -euo pipefail
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
F=features/fmnist-effl0.h5
[ -f $F ] || mr2probe extract --encoder efficientnet-lite0 --dataset fashion-mnist --out $F
R=results/fmnist-effl0-adapter
# A cell whose folder holds results.json is finished and is not trained again (as in
# results/fmnist-effl0-settings/run.sh: parts/ are not in git; delete a cell's results.json to retrain it).
run_cell() {  # run_cell OUT TRAIN-ARGS...
  local out=$1; shift
  if [ -f "$out/results.json" ]; then echo "finished: $out"; else mr2probe train "$@" --out "$out" > /dev/null; fi
}
dirs=()
for cell in shots20 full; do
  for adapter in linear mlp; do
    case $cell-$adapter in
      shots20-*) P=(--train-profile shots:20 --episodes 3 --seeds 1) ;;
      full-linear) P=(--seeds 1) ;;
      full-mlp) P=(--seeds 3) ;;
    esac
    common=(--features $F --head linear --width 128 "${P[@]}" -q)
    run_cell $R/$cell-$adapter "${common[@]}" --adapter $adapter --methods ce,mr2,mr2_no_rep,supcon --set mr2.c_bar=1
    run_cell $R/$cell-$adapter-refscale "${common[@]}" --adapter $adapter --methods ce,mr2 --set mr2.c_bar=1 \
      --set mr2.rep_scale=reference
    dirs+=("$R/$cell-$adapter" "$R/$cell-$adapter-refscale")
    echo "done $cell $adapter"
  done
done
mr2probe report "${dirs[@]}" > /dev/null
