#!/usr/bin/env bash
# One device call of the queued H200 runs, from the repository root on the lent machine:
#
#   scripts/h200_call.sh JOBS DEADLINE_S GPUS [SLOTS]   (SLOTS: compile-only jobs a GPU, gpu_queue.py)
#
# Restores the caches carried from the last call (.cache/jcc: JAX's persistent compilation
# cache, .cache/atc: XLA's per-fusion autotune cache; the device tool's `carry: [".cache"]`) to
# /tmp/jcc and /tmp/atc, where the jobs' --compilation_cache_dir and --autotune_cache_dir point;
# runs the queue (scripts/gpu_queue.py, one job per GPU, results aiming later jobs); and leaves in
# $OUT everything a call's record needs: results.jsonl, summary.md, gpu_monitor.csv, the job logs
# and progress files (logs.tgz) and the caches for the next call (caches.tgz; unpack it into
# .cache here). The deadline plus the queue's stop sequence (about 64 s) and the copies must fit
# in the call's limit: 505 s for a 600 s call.
set -uo pipefail
JOBS=$1 DEADLINE=$2 GPUS=${3:-1} SLOTS=${4:-1}
OUT=${OUT:?set by the device tool}
Q=/tmp/q
rm -rf "$Q" && mkdir -p "$Q" /tmp/jcc /tmp/atc  # a warm machine keeps /tmp between calls
for c in jcc atc; do
  if [ -d ".cache/$c" ]; then cp -r ".cache/$c/." "/tmp/$c/"; fi
done
echo "caches restored: jcc $(du -sh /tmp/jcc | cut -f1), atc $(find /tmp/atc -type f | wc -l) entries"
export PYTHONUNBUFFERED=1
python3 scripts/gpu_queue.py "$JOBS" "$Q" "$DEADLINE" "$GPUS" "$SLOTS"
for f in results.jsonl summary.md summary.txt gpu_monitor.csv; do
  if [ -f "$Q/$f" ]; then cp "$Q/$f" "$OUT/"; fi
done
(cd "$Q" && tar czf "$OUT/logs.tgz" ./*.log ./*.progress.json ./*.autotune.txt 2>/dev/null)
tar czf "$OUT/caches.tgz" -C /tmp jcc atc
echo "caches saved: $(du -h "$OUT/caches.tgz" | cut -f1) (the carry limit is 64 MiB in all)"
