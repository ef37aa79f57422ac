#!/bin/bash
# s38b.sh OUTDIR -- the fused split-KV combine's first GPU call (session
# 38; templates/combine_fused.cuh, behind FLASHJIT_FUSED_COMBINE=1), from
# the repository root with build/ carried.  S38B_PARTS (default "tests ab
# fp8"), the whole bounded by S38B_SECONDS (560):
#   tests  with FLASHJIT_FUSED_COMBINE=1, at once: gpu_fused_combine (the
#          fused result beside the combine kernel's, repeated calls, a
#          graph replayed, a caller's workspace), gpu_serving_decode,
#          gpu_serving_graph, gpu_serving_varlen, gpu_fp8_kv,
#          gpu_fp8_kv_paged.
#   ab     bench/decode_probe.py --fused-ab: the long decodes (32k and 64k
#          keys) at the rule's splits, 16 and 29, combine kernel / fused
#          alternately, three rounds, graph times.  Predicted on the H200:
#          the 32k single decode 0.5-1.5 us less (0.82-0.83 -> 0.84-0.86
#          of the copy's rate); on the H100 (51.0 us, 0.886) 0.5-1.5 us less.
#   fp8    bench/fp8_kv_compare.py with FLASHJIT_FUSED_COMBINE=0, then =1.
set -u
. bench/probes/parts_lib.sh
parts_start s38b "${1:-}" ${S38B_SECONDS:-560}
py() { PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s38b PYTHONUNBUFFERED=1 timeout $(bound "$1") python3 "${@:2}"; }
part_tests() {
  local t pids=()
  for t in gpu_fused_combine:150 gpu_serving_decode:200 gpu_serving_graph:60 gpu_serving_varlen:200 gpu_fp8_kv:200 gpu_fp8_kv_paged:200; do
    (cd build && FLASHJIT_FUSED_COMBINE=1 FLASHJIT_CACHE_DIR=/tmp/s38b-${t%%:*} timeout $(bound ${t#*:}) ./tests/fj_tests ${t%%:*} >"$out/${t%%:*}.log" 2>&1
     echo "${t%%:*}: exit $? ($(grep -c '^ok' "$out/${t%%:*}.log") ok, $(grep -c 'FAIL' "$out/${t%%:*}.log") FAIL)"
     grep -E 'FAIL|fused|combine kernel|cases passed|differ|identical' "$out/${t%%:*}.log" | head -12 | cut -c1-220) &
    pids+=($!)
  done
  wait "${pids[@]}"
}
part_ab() {
  py 200 bench/decode_probe.py --fused-ab --iters 30 >"$out/ab.log" 2>&1
  echo "ab: exit $?"; grep -E 'median|Error|error' "$out/ab.log" | cut -c1-220
}
part_fp8() {
  local m
  for m in 0 1; do
    FLASHJIT_FUSED_COMBINE=$m py 80 bench/fp8_kv_compare.py --out "$out" >"$out/fp8kv$m.log" 2>&1
    echo "fp8kv fused=$m: exit $?"; grep -E '^fp8kv' "$out/fp8kv$m.log" | head -4 | cut -c1-200
  done
}
parts_run s38b ${S38B_PARTS:-tests ab fp8}
