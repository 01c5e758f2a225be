#!/usr/bin/env bash
# The GPU runs behind docs/results/ for the harness (issue 2): each workload's max
# batch at full memory and under a 24 GB cap, and throughput at the found max in
# fp32 and bf16 (plus the 2020 default precision). Logs and JSON lines go to $OUT.
# Usage: OUT=dir scripts/h200_harness.sh MODEL [MODEL ...]
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
STEPS=${STEPS:-10}
run() { python3 -m jaxbench.main --output="$OUT/results.jsonl" --steps="$STEPS" --windows=5 --warmup_steps=2 "$@" 2>&1 | tee -a "$OUT/log.txt"; }
last_max() { python3 -c "import json,sys; r=[json.loads(l) for l in open('$OUT/results.jsonl')]; print([x for x in r if x['workload']=='$1'][-1]['max_batch'])"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$OUT/log.txt"
python3 -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__)" | tee -a "$OUT/log.txt"
for model in "$@"; do
  for precision in ${PRECISIONS:-fp32 bf16}; do
    run --model="$model" --precision="$precision"
  done
  if [ -n "${LIMIT_GB:-24}" ]; then
    run --model="$model" --memory_limit_gb="${LIMIT_GB:-24}" ${LIMIT_FLAGS:-}
  fi
done
