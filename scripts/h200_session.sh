#!/usr/bin/env bash
# A whole device session of queued H200 work that outlives each device call: two queues, one after
# the other, run by a daemon on the warm machine while each call only waits and copies out.
#
#   call 1:        scripts/h200_session.sh start JOBS1 SLOTS1 END1_S JOBS2 END2_S && \
#                  scripts/h200_session.sh wait WAIT_S
#   calls 2, 3..:  scripts/h200_session.sh wait WAIT_S     (within the machine's 30 s warm window)
#
# Phase 1 is scripts/gpu_queue.py over JOBS1 with SLOTS1 jobs on the GPU (compile-only --predict
# jobs can share it), cut END1_S seconds after the start; phase 2 follows at once, over JOBS2 with
# one job on the GPU (runs that time steps), cut END2_S seconds after the start. Both share
# /tmp/jcc (JAX's persistent compilation cache) and /tmp/atc (XLA's autotune cache), so a step
# that phase 1 compiled is loaded, not compiled, by a phase-2 run of the same program; phase 2's
# lines can name /tmp/sess/q1/results.jsonl in --search_hints (it always exists). Why a daemon: a
# call lasts at most 600 s and some compiles take 400 s, so a queue cut at each call's end would
# lose the compile in flight; the daemon (setsid, so the device tool leaves it running between
# calls) loses nothing as long as each call comes before the warm machine is given back.
#
# The daemon runs a copy of the repository (/tmp/sess/repo), so that a call's fresh copy of the
# working tree cannot change the code under a job. `wait` returns after WAIT_S seconds or once
# the daemon has ended, whichever is first, and leaves in $OUT what the session's record needs
# so far: results1.jsonl and results2.jsonl (each queue's results), summary.md, logs.tgz (job
# logs, GPU monitors, the daemon's log) and atc.tgz (XLA's autotune cache, /tmp/atc: unpack it into
# .cache here and carry .cache/atc to the next session's first call). Each call copies the whole
# of it again: the last call's copy is the session's.
set -uo pipefail
S=${H200_SESSION_DIR:-/tmp/sess}
case "${1:-}" in
  start)
    JOBS1=$2 SLOTS1=$3 END1=$4 JOBS2=$5 END2=$6
    if [ -e "$S/daemon.pid" ] && kill -0 "$(cat "$S/daemon.pid")" 2>/dev/null; then
      echo "h200_session: a session daemon is already running" >&2
      exit 2
    fi
    rm -rf "$S" && mkdir -p "$S/q1" "$S/q2" /tmp/jcc /tmp/atc
    # XLA's autotune cache from an earlier session, if the call carried it (.cache/atc: unpack
    # an earlier `wait`'s atc.tgz there): a compile cut at a session's end goes on from it.
    # The daemon's log says how many results /tmp/atc holds when it starts.
    if [ -d .cache/atc ]; then cp -r .cache/atc/. /tmp/atc/; fi
    mkdir -p "$S/repo" && tar -C . --exclude=./.git --exclude=./.venv --exclude=./.cache -cf - . |
      tar -C "$S/repo" -xf -
    touch "$S/q1/results.jsonl"
    # Job control on: without it bash starts a background command with SIGINT and SIGQUIT
    # ignored, every job inherits that, and Python then never sees the queue's SIGINT at its
    # deadline (session 10: each cut job was killed 60 s after an unheeded SIGINT).
    set -m
    setsid nohup bash -c "
      echo \$\$ >'$S/daemon.pid'
      echo \"daemon \$\$, signals ignored (/proc): \$(grep SigIgn /proc/\$\$/status 2>/dev/null)\"
      cd '$S/repo' || exit 1
      export PYTHONUNBUFFERED=1
      # How far a compile's autotuning has got, once a minute: XLA writes each instruction's
      # result into the autotune cache as it is settled (session 14: nasnet_large bf16's 313 s
      # compile took the count from 1 to 515 files), so a compile cut at the deadline leaves
      # its settled results for the next session (atc.tgz; that a later compile reads them
      # back is not yet shown). Sessions 12 and 13 found the cache empty because JAX had moved
      # it into --compilation_cache_dir (fixed in jaxbench/backend.py). XLA's autotuner VLOG
      # lines (TF_CPP_VMODULE) printed nothing in sessions 13 and 14: the count is the only
      # progress signal.
      echo \"autotune results at the start: \$(find /tmp/atc -type f | wc -l) files in /tmp/atc\"
      ( while sleep 60; do
          echo \"\$(date -u +%TZ) \$(find /tmp/atc -type f | wc -l) files in /tmp/atc\"
        done ) >'$S/atc_count.log' 2>&1 &
      watcher=\$!
      start=\$(date +%s)
      echo \"phase 1 starts \$(date -u +%FT%TZ): $JOBS1, $SLOTS1 a GPU, until $END1 s\"
      python3 scripts/gpu_queue.py '$JOBS1' '$S/q1' '$END1' 1 '$SLOTS1'
      left=\$(( $END2 - (\$(date +%s) - start) ))
      echo \"phase 2 starts \$(date -u +%FT%TZ): $JOBS2, \$left s left\"
      python3 scripts/gpu_queue.py '$JOBS2' '$S/q2' \"\$left\" 1 1
      echo \"ended \$(date -u +%FT%TZ)\"
      kill \$watcher 2>/dev/null
    " >"$S/daemon.log" 2>&1 </dev/null &
    # The daemon writes its own pid: under job control setsid forks, and $! would be its parent.
    for _ in 1 2 3 4 5 6 7 8 9 10; do [ -s "$S/daemon.pid" ] && break; sleep 0.5; done
    echo "h200_session: daemon $(cat "$S/daemon.pid") started"
    ;;
  wait)
    WAIT=$2
    OUT=${OUT:?set by the device tool}
    pid=$(cat "$S/daemon.pid" 2>/dev/null || echo 0)
    for ((i = 0; i < WAIT; i += 5)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 5
    done
    kill -0 "$pid" 2>/dev/null && echo "daemon running" || echo "daemon ended"
    for q in 1 2; do
      if [ -f "$S/q$q/results.jsonl" ]; then cp "$S/q$q/results.jsonl" "$OUT/results$q.jsonl"; fi
    done
    (cd "$S/repo" && cat "$S"/q*/results.jsonl >"$S/all.jsonl" && python3 scripts/summarize.py \
      "$S/all.jsonl") >"$OUT/summary.md" 2>&1
    (cd "$S" && tar czf "$OUT/logs.tgz" --exclude=results.jsonl daemon.log atc_count.log q1 q2 2>/dev/null)
    # The autotune cache so far (small: 1.7 MB for deeplabv3 bf16 at 8 images), for the next
    # session to carry: a full-memory compile's autotuning can outlast a session.
    tar czf "$OUT/atc.tgz" -C /tmp atc
    tail -n 5 "$S/daemon.log"
    cat "$S"/q*/summary.txt 2>/dev/null
    shopt -s nullglob
    for f in "$S"/q*/job*.log; do echo "== $f: $(grep -c . "$f") lines"; tail -n 2 "$f"; done
    true
    ;;
  *)
    echo "usage: $0 start JOBS1 SLOTS1 END1_S JOBS2 END2_S | wait WAIT_S" >&2
    exit 2
    ;;
esac
