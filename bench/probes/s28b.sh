#!/bin/bash
# s28b.sh OUTDIR -- the twenty-eighth session's second device call, from
# the repository root with build/ (main's build) and build-gq/ (branch
# gqadet's: the deterministic mode's descending walk under GQA,
# FLASHJIT_BWD_DESCEND=1, off by default) carried.  build-gq: a worktree
# of main with bench/probes/gqadet.patch applied (`git apply`), built
# (cmake -DCMAKE_BUILD_TYPE=Release) and slimmed as pending.sh says.  Parts (S28B_PARTS;
# S28B_SECONDS bounds the whole, default 560):
#   gqcheck  one small checked run of the descending walk under build-gq
#            (a hang ends at 60 s, and the call's gq parts with it), then
#            its gpu_backward_deterministic (the seven new cases with
#            FLASHJIT_BWD_DESCEND=1; bounded 200 s).
#   gqtime   build-gq's flashjit run --backward, bf16 causal, at (1,32/8,
#            8192,128), (4,32/8,2048,128), (2,16/4,8192,128): the default
#            mode under main's templates (FLASHJIT_TEMPLATE_DIR=templates)
#            and the branch's, then deterministic plain (DESCEND=0) and
#            descending (=1); two rounds.  Predicted: the descending walk
#            1.25-1.6x the default's time (plain: 2.0x at the first shape
#            on the H200), the default mode within 1% of main's.
#   f16      main's bench/bwd_compare.py in f16, five head dims, and the
#            GQA probes (H200 only: the bar's figures).
#   gpt      bench/probes/gpt_attn_prof.py (the GPT example's attention
#            call beside SDPA's), then examples/gpt_train.py --steps 300.
set -u
. bench/probes/parts_lib.sh
parts_start s28b "${1:-}" ${S28B_SECONDS:-560}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)
echo "s28b gpu: $gpu"
cache=/tmp/s28b-gq
gq_ok=1
part_gqcheck() {
  (cd build-gq && FLASHJIT_BWD_DESCEND=1 FLASHJIT_CACHE_DIR=$cache timeout $(bound 60) ./flashjit run --backward \
     --deterministic --shape 1,8,700,64 --heads-kv 2 --causal --dtype bf16 --check --verbose) >"$out/first.log" 2>&1
  echo "gq first check: exit $?; $(grep -cE -- '-> PASS' "$out/first.log") PASS, $(grep -cE -- '-> FAIL' "$out/first.log") FAIL;" \
       "the descending walk's trace $(grep -c 'descending walk' "$out/first.log") times (0: mode 3 never engaged)"
  if ! grep -q -- '-> PASS' "$out/first.log" || grep -q -- '-> FAIL' "$out/first.log"; then
    tail -n 3 "$out/first.log" | cut -c1-200
    echo "gq: the first check did not pass; no more gq parts"
    gq_ok=0
    return
  fi
  (cd build-gq && FLASHJIT_CACHE_DIR=$cache timeout $(bound ${S28B_TEST_SECONDS:-200}) ./tests/fj_tests gpu_backward_deterministic \
     >"$out/gpu_backward_deterministic.log" 2>&1
   echo "gpu_backward_deterministic (build-gq): exit $? ($(grep -c '^ok' "$out/gpu_backward_deterministic.log") ok, $(grep -c 'FAIL' "$out/gpu_backward_deterministic.log") FAIL)"
   grep -E 'FAIL|descend' "$out/gpu_backward_deterministic.log" | head -12)
}
gq_run() {  # TAG ENV SHAPE HKV FLAGS
  local us
  us=$(cd build-gq && env $2 FLASHJIT_CACHE_DIR=$cache timeout $(bound 60) ./flashjit run --backward $5 \
         --shape $3 --heads-kv $4 --causal --dtype bf16 --iters 20 2>&1 | tee -a "$out/time.log" |
         grep -oE 'median [0-9.]+ us' | grep -oE '[0-9.]+')
  echo "gq time $3/$4 $1: ${us:-?} us"
}
part_gqtime() {
  [ $gq_ok = 1 ] || { echo "gqtime: skipped (the check failed)"; return; }
  local sh shape hkv round
  for sh in ${S28B_GQ_SHAPES:-1,32,8192,128:8 4,32,2048,128:8 2,16,8192,128:4}; do
    shape=${sh%%:*} hkv=${sh##*:}
    for round in 1 2; do
      gq_run "default main-templates r$round" "FLASHJIT_TEMPLATE_DIR=$root/templates" $shape $hkv ""
      gq_run "default branch r$round" "FLASHJIT_BWD_DESCEND=0" $shape $hkv ""
      gq_run "det plain r$round" "FLASHJIT_BWD_DESCEND=0" $shape $hkv --deterministic
      gq_run "det descend r$round" "FLASHJIT_BWD_DESCEND=1" $shape $hkv --deterministic
    done
  done
}
part_f16() {
  case "$gpu" in *H200*) ;; *) echo "f16: skipped (not an H200)"; return;; esac
  PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s28b-f16 timeout $(bound 200) \
    python3 bench/bwd_compare.py --dims 64,96,128,192,256 --dtypes f16 \
    --gqa "1,32,8,8192,128,1;1,32,8,8192,128,0;2,16,16,8192,128,1;4,32,8,2048,128,1;2,16,4,8192,128,1" \
    --out "$out/f16" >"$out/f16.log" 2>&1
  echo "f16: exit $?"
  grep -E "geomean|gqa|Error" "$out/f16.log" | sed -E 's/flashjit_tflops.*det_us/det_us/; s/rel_dq.*cudnn_over_fj/cudnn_over_fj/; s/flash_us.*//'
}
part_gpt() {
  PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s28b-gpt timeout $(bound 90) \
    python3 bench/probes/gpt_attn_prof.py >"$out/gpt_attn.log" 2>&1
  echo "gpt_attn: exit $?"; grep -A4 "^gpt_attn" "$out/gpt_attn.log" | cut -c1-140
  PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s28b-gpt timeout $(bound 120) \
    python3 examples/gpt_train.py --steps 300 >"$out/gpt_train.log" 2>&1
  echo "gpt_train: exit $?"; tail -5 "$out/gpt_train.log"
}
parts_run s28b ${S28B_PARTS:-gqcheck gqtime f16 gpt}
