#!/bin/bash
# bwd_sparse.sh OUTDIR -- where the backward's time goes on the issue-33
# cases, from build/ on the GPU machine: each case's `flashjit run
# --backward` (median of its kernels' three launches), then ncu's duration
# of each backward kernel (preprocess, main, postprocess) of one call.
# (4, 16, 4096, 128) bf16, causal: plain, a window of 1024, documents (8,
# sorted ids in doc8_4096.i32) with the library's 128 x 128 block mask,
# ALiBi, a bias table.
out=${1:-/tmp/bwd_sparse}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
base=(--shape 4,16,4096,128 --dtype bf16 --causal)
declare -A cases=(
  [causal]=""
  [window]="--window 1024,0"
  [document]="--mod documents --param doc:i32[4096]@$here/doc8_4096.i32 --block-mask 128,128"
  [alibi]="--mod alibi --param slopes:f32[16]"
  [relbias]="--mod relative-bias --param bias:f32[16,8193] --param max_distance=4096"
)
for c in causal window document alibi relbias; do
  # shellcheck disable=SC2086
  build/flashjit run --backward "${base[@]}" ${cases[$c]} --iters 10 >"$out/run_$c.log" 2>&1
  echo "$c: $(grep -iE 'median|us|TFLOP' "$out/run_$c.log" | tr '\n' ' ' | cut -c1-300)"
  # shellcheck disable=SC2086
  ncu --metrics gpu__time_duration.sum -k regex:fj_bwd --csv build/flashjit run --backward \
    "${base[@]}" ${cases[$c]} --iters 1 >"$out/ncu_$c.csv" 2>"$out/ncu_$c.err"
  grep gpu__time_duration "$out/ncu_$c.csv" | awk -F'","' '{print "  " $5 " " $(NF)}' | tail -3
done
