#!/bin/bash
# s39c.sh OUTDIR -- the sliced combine's 32 splits in flight (5d1cb94) on a
# GPU: its tests, and bench/mla_compare.py's single decodes under three
# builds, each its own process, two rounds: main's (build/), main's with
# bench/probes/combine_vec.patch (build-vec/: a lane's 4 adjacent columns
# by one 16-byte load, compiled 630 -> 450 ms on the build machine) and
# the old combine (build-cc/, combine_unroll.patch with its variables
# unset: 8 splits in flight).  The contiguous outputs are compared bit for
# bit (the sums' order is the same in all three).  Predicted: main and vec
# 20.9-21.2 us at 32k keys on an H100 (old 23.7-23.9), vec within 1% of
# main.  Bounded by S39C_SECONDS (280).
set -u
. bench/probes/parts_lib.sh
parts_start s39c "${1:-}" ${S39C_SECONDS:-280}
part_tests() { gpu_tests_at build /tmp/s39c 'FAIL|cases passed' gpu_mla_paged:70 gpu_merge:50 gpu_serving_decode:70 gpu_wide_heads:70; }
part_ab() {
  local round lib
  for round in 1 2; do
    for lib in build build-vec build-cc; do
      mkdir -p "$out/dump_${lib}_$round"
      PYTHONPATH=python FLASHJIT_LIB=$lib/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s39c-$lib timeout $(bound 60) \
        python3 bench/mla_compare.py --cases 0,1 --iters 50 --dump "$out/dump_${lib}_$round" --out "$out" \
        >"$out/ab_${lib}_$round.log" 2>&1
      echo "$lib round $round: exit $?"
      grep -E '^mla|Error' "$out/ab_${lib}_$round.log" | cut -c1-120
    done
  done
  python3 bench/probes/compare_dumps.py "$out" build_1 build-vec_1 build-cc_1 build_2
}
parts_run s39c ${S39C_PARTS:-tests ab}
