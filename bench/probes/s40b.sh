#!/bin/bash
# s40b.sh OUTDIR -- bench/probes/split_cluster.patch on a GPU (sm_90): the
# split kernel's blocks in clusters of C consecutive splits of one row
# tile merge their partial rows through distributed shared memory before
# writing them (FJ_PROBE_SPLIT_CLUSTER=C, 2..8; dense problems only, the
# split count a multiple of C), so the combine reads splits / C partials.
# Why: MLA's single decode over 32k keys writes and reads 4 MB of partials
# (128 splits x 16 rows x 512 floats) in a 21 us call (H100, 5d1cb94).
# Predicted: C = 8 takes 1.5-3 us off it (0.5 MB of partials, the combine
# over 16); the d128 decode over 32k keys (16 splits, 256 KB) within
# noise.  From the repository root with the patched tree's build as
# build-clu/ (slimmed, with -DFLASHJIT_SHARED=ON's library):
#   git worktree add /tmp/clu HEAD && (cd /tmp/clu && git apply $PWD/bench/probes/split_cluster.patch &&
#   cmake -S . -B build -DFLASHJIT_WERROR=ON && cmake --build build -j2) && cp -a /tmp/clu/build build-clu
# Design and what a landing needs: bench/probes/split_cluster.md.
# Parts (S40B_PARTS, default "check ab"), bounded by S40B_SECONDS (300):
#   check  `flashjit run --check` with C = 8 and 4: MLA's decode (16 and
#          128 heads, splits 8-128), the d128 GQA decode (splits 16, 32),
#          two query rows bottom-right, f16; each bounded.
#   ab     C = 0, 8, 4 alternately (one process each), two rounds:
#          bench/mla_compare.py --cases 0,1 (contiguous clustered; paged
#          unclustered) and bench/decode_probe.py --long --splits 0,16
#          --no-tiles; the outputs' largest difference from C = 0's.
set -u
. bench/probes/parts_lib.sh
parts_start s40b "${1:-}" ${S40B_SECONDS:-300}
part_check() {
  local c a
  for c in 8 4; do
    for a in "--shape 1,16,1,576 --heads-kv 1 --seq-kv 32768 --head-dim-v 512 --latent --splits 128" \
             "--shape 2,128,1,576 --heads-kv 1 --seq-kv 5000 --head-dim-v 512 --latent --splits 16" \
             "--shape 1,16,2,576 --heads-kv 1 --seq-kv 4097 --head-dim-v 512 --latent --splits 8 --causal=bottom-right" \
             "--shape 1,32,1,128 --heads-kv 8 --seq-kv 32768 --splits 16" \
             "--shape 3,32,1,128 --heads-kv 8 --seq-kv 3000 --splits 32 --dtype f16"; do
      # shellcheck disable=SC2086
      echo "C=$c $a: $(cd build-clu && FJ_PROBE_SPLIT_CLUSTER=$c FLASHJIT_CACHE_DIR=/tmp/s40b timeout $(bound 60) \
        ./flashjit run --check $a --iters 3 2>&1 | grep -E 'PASS|FAIL|rror' | cut -c1-160 | tr '\n' ' ') (exit ${PIPESTATUS[0]})"
    done
  done
}
part_ab() {
  local round c
  for round in 1 2; do
    for c in 0 8 4; do
      mkdir -p "$out/dump_${c}_$round"
      FJ_PROBE_SPLIT_CLUSTER=$c PYTHONPATH=python FLASHJIT_LIB=build-clu/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s40b-ab \
        timeout $(bound 60) python3 bench/mla_compare.py --cases 0,1 --iters 50 --dump "$out/dump_${c}_$round" --out "$out" \
        >"$out/mla_${c}_$round.log" 2>&1
      echo "C=$c round $round mla: exit $?"; grep -E '^mla|Error' "$out/mla_${c}_$round.log" | cut -c1-150
      FJ_PROBE_SPLIT_CLUSTER=$c PYTHONPATH=python FLASHJIT_LIB=build-clu/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s40b-ab \
        timeout $(bound 60) python3 bench/decode_probe.py --long --splits 0,16 --no-tiles --iters 30 \
        >"$out/decode_${c}_$round.log" 2>&1
      echo "C=$c round $round decode: exit $?"; grep -E '^decode.*splits|Error' "$out/decode_${c}_$round.log" | cut -c1-150
    done
  done
  python3 bench/probes/compare_dumps.py "$out" 0_1 8_1 4_1 0_2
}
parts_run s40b ${S40B_PARTS:-check ab}
