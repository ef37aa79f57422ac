#!/bin/bash
# s39b.sh OUTDIR -- MLA's single decode: the split-KV combine's memory
# parallelism (issue 34, item 3; 0.67-0.71 of a copy on the H200, bar
# 0.8).  From the repository root with main's build as build/ and
# bench/probes/combine_unroll.patch's build (-DFLASHJIT_SHARED=ON) as
# build-cc/: the patch reads FJ_PROBE_COMBINE_COLS (the slice width where
# the combine's row blocks are fewer than the multiprocessors; main 128)
# and FJ_PROBE_COMBINE_UNROLL (a warp's splits loaded at once; main 8).
# Why: the 128 splits' partials are 4 MB (128 x 16 rows x 512 floats);
# main's combine has 64 blocks x 4 warps x 8 splits x 4 columns x 32
# lanes x 4 bytes = 1 MB in flight, so at about a microsecond of latency
# it reads them at about 1 TB/s, some 4 us of a 20 us call.  Predicted:
# unroll 32 (4 MB in flight) takes 1.5-2.5 us off the (1, 16/1, 1/32768)
# call (0.71 -> 0.76-0.80 of a copy contiguous); the width alone changes
# little (the bytes in flight are the same); 64k keys gain the same
# microseconds (a smaller share).  Each configuration a process of its own
# (bench/mla_compare.py --cases 0,1: contiguous and paged), two rounds.
# Bounded by S39B_SECONDS (300).
set -u
. bench/probes/parts_lib.sh
parts_start s39b "${1:-}" ${S39B_SECONDS:-300}
part_comb() {
  local round cfg
  for round in 1 2; do
    for cfg in "128 8" "128 16" "128 32" "64 32" "32 32"; do
      set -- $cfg
      FJ_PROBE_COMBINE_COLS=$1 FJ_PROBE_COMBINE_UNROLL=$2 PYTHONPATH=python FLASHJIT_LIB=build-cc/libflashjit.so \
        FLASHJIT_CACHE_DIR=/tmp/s39b timeout $(bound 60) python3 bench/mla_compare.py --cases 0,1 --iters 50 \
        --out "$out" >"$out/comb_${1}_${2}_$round.log" 2>&1
      echo "cols=$1 unroll=$2 round $round: exit $?"
      grep -E '^mla|Error' "$out/comb_${1}_${2}_$round.log" | cut -c1-200
    done
  done
}
parts_run s39b comb
