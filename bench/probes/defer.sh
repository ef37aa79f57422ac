#!/bin/bash
# defer.sh OUTDIR -- the deterministic backward's deferred turns
# (bench/probes/defer.patch, prepared without a GPU on 2026-12-07: where
# FLASHJIT_BWD_DEFER=1 the narrow wgmma kernel is rendered with DEFER, a
# kernel of its own named "_defer", whose dQ writer passes a step's turns
# on once the next step's bulk reduce-adds are issued -- their completion
# waited for then -- instead of waiting for it before the next step's
# turn).  From the repository root with build/ (main's) and build-df/
# (main with the patch applied, built and slimmed as pending.sh says)
# carried.  Parts (DF_PARTS; DF_SECONDS bounds the whole, default 560):
#   check  one small checked deterministic run with DEFER at d64 causal
#          GQA and d128 without a mask (a hang ends at 60 s, and the
#          call's other parts with it), then gpu_backward_deterministic
#          with FLASHJIT_BWD_DEFER=1 (bounded 240 s): every narrow-kernel
#          case against the float64 reference and its reruns' bits
#          (DF_TEST_SECONDS=0: the two checked runs only).
#   time   flashjit run --backward, bf16, (8,16,2048,D) and (2,16,8192,D),
#          D 64, 96, 128, none and causal, and (1,32/8,8192,128) causal:
#          the default mode, deterministic (DEFER=0) and deterministic
#          with DEFER=1, one round each (a line a shape).
# Prediction: where the writer's serialised completion limits a step
# (the rotation without a mask; head dim 64's short steps) the
# deterministic / default ratio falls from 1.17-1.33 towards 1.1; under a
# causal mask, where the next key tile waits on the turn, it may rise by
# up to a step's time per key tile (a few percent).  Land it (on by
# default) only where it is faster and every check passes.
set -u
. bench/probes/parts_lib.sh
parts_start defer "${1:-}" ${DF_SECONDS:-560}
echo "defer gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)"
cache=/tmp/defer-cache
df_ok=1
part_check() {
  local args
  for args in "1,8,700,64 --heads-kv 2 --causal" "1,4,700,128"; do
    (cd build-df && FLASHJIT_BWD_DEFER=1 FLASHJIT_CACHE_DIR=$cache timeout $(bound 60) ./flashjit run --backward \
       --deterministic --shape $args --dtype bf16 --check --verbose) >"$out/check.log" 2>&1
    echo "defer check $args: exit $?; $(grep -cE -- '-> PASS' "$out/check.log") PASS, $(grep -cE -- '-> FAIL' "$out/check.log") FAIL," \
         "$(grep -c '_defer' "$out/check.log") lines name a _defer kernel"
    if ! grep -q -- '-> PASS' "$out/check.log" || grep -q -- '-> FAIL' "$out/check.log"; then
      tail -n 3 "$out/check.log" | cut -c1-200; echo "defer: the check did not pass; no more parts"; df_ok=0; return
    fi
  done
  [ "${DF_TEST_SECONDS:-240}" = 0 ] && { echo "gpu_backward_deterministic (DEFER=1): not run (DF_TEST_SECONDS=0)"; return; }
  (cd build-df && FLASHJIT_BWD_DEFER=1 FLASHJIT_CACHE_DIR=$cache timeout $(bound ${DF_TEST_SECONDS:-240}) \
     ./tests/fj_tests gpu_backward_deterministic >"$out/gpu_backward_deterministic.log" 2>&1
   echo "gpu_backward_deterministic (DEFER=1): exit $? ($(grep -c '^ok' "$out/gpu_backward_deterministic.log") ok," \
        "$(grep -c 'FAIL' "$out/gpu_backward_deterministic.log") FAIL)"
   grep -E 'FAIL' "$out/gpu_backward_deterministic.log" | head -8)
}
df_run() {  # ENV SHAPE FLAGS -> the median (us)
  local us
  us=$(cd build-df && env $1 FLASHJIT_CACHE_DIR=$cache timeout $(bound 60) ./flashjit run --backward $3 \
         --shape $2 --dtype bf16 --iters 20 2>&1 | tee -a "$out/time.log" | grep -oE 'median [0-9.]+ us' | grep -oE '[0-9.]+')
  echo "${us:-?}"
}
part_time() {
  [ $df_ok = 1 ] || { echo "time: skipped (the check failed)"; return; }
  local d s m line
  for d in 64 96 128; do
    for s in 8,16,2048 2,16,8192; do
      for m in "" --causal; do
        line="defer $s,$d ${m:-none}: default $(df_run FLASHJIT_BWD_DEFER=0 $s,$d "$m")"
        line="$line det $(df_run FLASHJIT_BWD_DEFER=0 $s,$d "$m --deterministic")"
        line="$line det+defer $(df_run FLASHJIT_BWD_DEFER=1 $s,$d "$m --deterministic")"
        echo "$line"
      done
    done
  done
  line="defer 1,32/8,8192,128 causal: default $(df_run FLASHJIT_BWD_DEFER=0 1,32,8192,128 '--heads-kv 8 --causal')"
  line="$line det $(df_run FLASHJIT_BWD_DEFER=0 1,32,8192,128 '--heads-kv 8 --causal --deterministic')"
  echo "$line det+defer $(df_run FLASHJIT_BWD_DEFER=1 1,32,8192,128 '--heads-kv 8 --causal --deterministic')"
}
parts_run defer ${DF_PARTS:-check time}
