#!/bin/bash
# MR2 dose–response (issue "Settings where methods can differ", §4) on full Fashion-MNIST × EfficientNet-Lite0
# features, one cell per setting: balanced (full), long-tailed ρ = 100, 5-shot (5 episodes). The quantity of
# interest is the paired difference MR2 − mr2_uniform (same seeds, same test images), so mr2_uniform is the
# reference: every Δ column of `mr2` below is MR2 − mr2_uniform with its bootstrap CI (groups: mr2_uniform's,
# ranked on val). Variants: margin exponent e ∈ {1/3 (default), 1, 3} and statistics norm p ∈ {2, 3 (default), 5}
# on the linear head; statistics on the classifier's input vs its representation (stats_on, which differs only
# where the head transforms z: the cosine head) on the cosine head. 3 seeds, no null control (the contrast is
# between two methods). Resumable: finished seeds are kept in each run folder's parts/.
set -euo pipefail
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
F=features/fmnist-effl0.h5
[ -f $F ] || mr2probe extract --encoder efficientnet-lite0 --dataset fashion-mnist --out $F
R=results/fmnist-effl0-dose
# A folder that holds results.json is finished and is not trained again (as in results/fmnist-effl0-settings/run.sh:
# parts/ are not in git; delete a folder's results.json to retrain it).
run() {  # run FOLDER PROFILE EPISODES HEAD [--set ...]
  local out=$1 profile=$2 episodes=$3 head=$4; shift 4
  [ -f "$R/$out/results.json" ] && { echo "finished: $R/$out"; return; }
  mr2probe train --features $F --methods mr2,mr2_uniform --reference mr2_uniform --no-null --head "$head" \
    --seeds 3 --train-profile "$profile" --episodes "$episodes" --out "$R/$out" -q "$@" > /dev/null
  echo "done $out"
}
dirs=()
for cell in "longtail100 longtail:100 1" "shots5 shots:5 5" "full full 1"; do
  read -r tag profile episodes <<< "$cell"
  run "$tag-linear-e0.33-p3" "$profile" "$episodes" linear
  run "$tag-linear-e1" "$profile" "$episodes" linear --set mr2.exponent=1
  run "$tag-linear-e3" "$profile" "$episodes" linear --set mr2.exponent=3
  run "$tag-linear-p2" "$profile" "$episodes" linear --set mr2.p=2
  run "$tag-linear-p5" "$profile" "$episodes" linear --set mr2.p=5
  run "$tag-cosine-classifier" "$profile" "$episodes" cosine
  run "$tag-cosine-input" "$profile" "$episodes" cosine --set mr2.stats_on=input
  dirs+=("$R/$tag-linear-e0.33-p3" "$R/$tag-linear-e1" "$R/$tag-linear-e3" "$R/$tag-linear-p2" "$R/$tag-linear-p5"
         "$R/$tag-cosine-classifier" "$R/$tag-cosine-input")
done
mr2probe report "${dirs[@]}" > /dev/null
