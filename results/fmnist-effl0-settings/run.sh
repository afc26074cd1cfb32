#!/bin/bash
# Settings where probe losses can differ (issue "Settings where methods can differ"), on full Fashion-MNIST ×
# EfficientNet-Lite0 features: long-tailed training sets (ρ = 100, 10) and few-shot ones (5 and 20 per class,
# 5 episodes), every method without an adapter + the reference probes logreg and knn, linear head, 3 seeds,
# null control, groups on val. Val and test are the full balanced splits. Run from the repository root;
# resumable (finished seeds are kept in each run folder's parts/). Cells are run in this order and each is
# reported as soon as it is done. Another dataset or encoder: set DATASET, ENCODER, F and R (as
# results/mnist-effl0-settings/run.sh does).
set -euo pipefail
export OMP_NUM_THREADS=1
DATASET=${DATASET:-fashion-mnist}
ENCODER=${ENCODER:-efficientnet-lite0}
F=${F:-features/fmnist-effl0.h5}
R=${R:-results/fmnist-effl0-settings}
[ -f $F ] || mr2probe extract --encoder $ENCODER --dataset $DATASET --out $F
M="all,logreg,knn"
mr2probe train --features $F --methods $M --head linear --seeds 3 --train-profile longtail:100 --out $R/linear-longtail100 -q
mr2probe train --features $F --methods $M --head linear --seeds 3 --train-profile shots:5 --episodes 5 --out $R/linear-shots5 -q
mr2probe train --features $F --methods $M --head linear --seeds 3 --train-profile longtail:10 --out $R/linear-longtail10 -q
mr2probe train --features $F --methods $M --head linear --seeds 3 --train-profile shots:20 --episodes 5 --out $R/linear-shots20 -q
mr2probe report $R/linear-longtail100 $R/linear-shots5 $R/linear-longtail10 $R/linear-shots20 --html > /dev/null
# The cosine head (scale grid on val), every method without an adapter (logreg and knn do not depend on the head:
# their rows are the linear cells'), long-tailed ρ = 100 first; the other cosine cells follow when time allows.
mr2probe train --features $F --methods all --head cosine --seeds 3 --train-profile longtail:100 --out $R/cosine-longtail100 -q
mr2probe report $R/linear-longtail100 $R/cosine-longtail100 --summary $R/cosine-vs-linear-longtail100.md > /dev/null
