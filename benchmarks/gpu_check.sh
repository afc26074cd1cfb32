#!/bin/bash
# The GPU path measured in one prepared run (benchmarks/gpu_check.py): extraction against the bare forward pass,
# the sweep at the ImageNet shape against the GPU's GEMM rate, and the projected time of the paper's grid.
# At most 5 minutes on a GPU; without one (or with --smoke) a tiny CPU smoke version in under 2 minutes.
# Run from the repository root: bash benchmarks/gpu_check.sh [--smoke]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
exec timeout 540 "$PY" benchmarks/gpu_check.py "$@"
