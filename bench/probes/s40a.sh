#!/bin/bash
# s40a.sh OUTDIR -- bench/probes/combine_once.patch on a GPU: the split-KV
# combine with one load site (its loads' and sums' code once, the first
# batch's loads in flight while the row's log-sum-exp is found; the sums'
# order unchanged, so the bits should be main's).  Compile time on the
# 2-core build machine (fj_attention_merge on a compile-only context, a
# fresh cache, 3 runs): the sliced MLA combine 550 -> 356 ms, the d128
# combine (every split decode's) 224 -> 166 ms.  From the repository root
# with main's build as build/ and the patched tree's as build-once/ (both
# slimmed; build-once/ with its tests):
#   git worktree add /tmp/once HEAD && (cd /tmp/once && git apply $PWD/bench/probes/combine_once.patch &&
#   cmake -S . -B build -DFLASHJIT_WERROR=ON && cmake --build build -j2) && cp -a /tmp/once/build build-once
# Parts (S40A_PARTS, default "tests ab"), bounded by S40A_SECONDS (300):
#   tests  build-once/'s gpu_merge, gpu_mla_paged, gpu_serving_decode,
#          gpu_serving_varlen, gpu_wide_heads, gpu_fp8_kv at once (bounded).
#   ab     main and the patch alternately, one process each, two rounds:
#          bench/mla_compare.py --cases 0,1 (outputs dumped and compared
#          bit for bit) and bench/decode_probe.py --long.  Predicted: the
#          same times within noise (the loop runs once where a warp's splits
#          fit one batch: every pick's), identical bits.
set -u
. bench/probes/parts_lib.sh
parts_start s40a "${1:-}" ${S40A_SECONDS:-300}
part_tests() { gpu_tests_at build-once /tmp/s40a 'FAIL|cases passed' gpu_merge:50 gpu_mla_paged:70 gpu_serving_decode:70 gpu_serving_varlen:70 gpu_wide_heads:70 gpu_fp8_kv:70; }
part_ab() {
  local round lib
  for round in 1 2; do
    for lib in build build-once; do
      mkdir -p "$out/dump_${lib}_$round"
      PYTHONPATH=python FLASHJIT_LIB=$lib/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s40a-$lib timeout $(bound 60) \
        python3 bench/mla_compare.py --cases 0,1 --iters 50 --dump "$out/dump_${lib}_$round" --out "$out" \
        >"$out/mla_${lib}_$round.log" 2>&1
      echo "$lib round $round mla: exit $?"; grep -E '^mla|Error' "$out/mla_${lib}_$round.log" | cut -c1-120
      PYTHONPATH=python FLASHJIT_LIB=$lib/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s40a-$lib timeout $(bound 80) \
        python3 bench/decode_probe.py --long --iters 30 >"$out/decode_${lib}_$round.log" 2>&1
      echo "$lib round $round decode: exit $?"; grep -E '^decode' "$out/decode_${lib}_$round.log" | grep -v tile_n | cut -c1-140
    done
  done
  python3 bench/probes/compare_dumps.py "$out" build_1 build-once_1 build-once_2 build_2
}
parts_run s40a ${S40A_PARTS:-tests ab}
