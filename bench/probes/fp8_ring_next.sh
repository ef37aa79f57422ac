#!/bin/bash
# fp8_ring_next.sh OUTDIR -- the FP8 ring's two prepared steps against the
# tree's templates, from build/ on the GPU machine:
#   next: fp8_ring_next.patch (P V in f16 under bf16 queries; paged FP8
#         page numbers a tile ahead);
#   k16:  fp8_k16.patch (next, and Q K^T in f16 too: K's tiles f16, Q's
#         tile f16 times a power of two; the decode loop 811 -> 715 -> 619
#         SASS instructions a 64-key tile);
#   regs: fp8_regs.patch (k16, and the 16-row decode tiles whose warps
#         split the keys read K and V straight from the FP8 ring by
#         ldmatrix, no 16-bit tiles: 53 KB of shared memory instead of
#         102 KB at d128, 4 blocks a multiprocessor, the loop 619 -> 468
#         SASS instructions; fp8_regs.md).  Its src/
#         part (variant.c: the plan's shared-memory estimate) needs a
#         rebuilt library; without it the H200's picks are the same and
#         each launch takes the kernel's own figure (fj__plan_fill), so the
#         set runs with the tree's binaries; REGS_BIN (below) names
#         binaries of the whole patch, carried, for its new test cases.
# First the FP8-KV GPU tests with each patched set (FLASHJIT_TEMPLATE_DIR;
# the test binary is the tree's), then `flashjit run` medians of the
# decode shapes, contiguous and paged, each template folder in turn, twice.
# NEXT_SETS picks the sets ("next k16"; "k16 regs" for this one's
# comparison), NEXT_TESTS the tests.
set -u
out=${1:-/tmp}
here=$(cd "$(dirname "$0")" && pwd)
sets=${NEXT_SETS-next k16}
for s in $sets; do
  rm -rf /tmp/fj-$s && mkdir /tmp/fj-$s && cp -r "$here/../../templates" /tmp/fj-$s/
  patch=$([ "$s" = next ] && echo fp8_ring_next.patch || echo fp8_$s.patch)
  # Templates only here (a patch's src/ part: REGS_BIN, below).
  (cd /tmp/fj-$s && git apply --include='templates/*' "$here/$patch") || { echo "fp8 $s: $patch does not apply"; exit 1; }
  for t in ${NEXT_TESTS-gpu_fp8_kv gpu_fp8_kv_paged}; do
    FLASHJIT_TEMPLATE_DIR=/tmp/fj-$s/templates timeout ${NEXT_TEST_TIMEOUT:-200} ./tests/fj_tests $t >"$out/${s}_$t.log" 2>&1
    echo "fp8 $s $t: exit $? ($(grep -c ' ok$' "$out/${s}_$t.log") ok, $(grep -c FAIL "$out/${s}_$t.log") FAIL)"
  done
done
# The regs set with binaries built from the whole patch (src/ and tests
# included), where REGS_BIN names them: the GPU machine has no Lua to build
# with, so build them on the build machine and carry them, e.g.
#   git worktree add /tmp/wt-regs main && cd /tmp/wt-regs &&
#   git apply bench/probes/fp8_regs.patch && cmake -S . -B build && cmake --build build -j2
#   mkdir -p <repo>/build-regs/tests && cp build/flashjit build/*.so* <repo>/build-regs/ &&
#   cp build/tests/fj_tests <repo>/build-regs/tests/
# and pass REGS_BIN=$PWD/../build-regs (run from build/).
bin=.
if [ -n "${REGS_BIN:-}" ] && [ -x "$REGS_BIN/flashjit" ]; then
  bin=$REGS_BIN
  for t in ${NEXT_TESTS-gpu_fp8_kv gpu_fp8_kv_paged}; do
    LD_LIBRARY_PATH=$bin:${LD_LIBRARY_PATH:-} FLASHJIT_TEMPLATE_DIR=/tmp/fj-regs/templates \
      timeout ${NEXT_TEST_TIMEOUT:-200} $bin/tests/fj_tests $t >"$out/regs_built_$t.log" 2>&1
    echo "fp8 regs (its own binaries) $t: exit $? ($(grep -c ' ok$' "$out/regs_built_$t.log") ok, $(grep -c FAIL "$out/regs_built_$t.log") FAIL)"
  done
fi
v64=$(python3 -c 'print(",".join(["1:4096"] * 64))')
for round in 1 2; do
  while IFS= read -r args; do
    line="fp8 r$round $args:"
    for t in tree $sets; do
      dir=$([ "$t" = tree ] || echo "/tmp/fj-$t/templates")
      fj=./flashjit
      [ "$t" = regs ] && [ "$bin" != . ] && fj=$bin/flashjit
      us=$(LD_LIBRARY_PATH=$([ "$fj" = ./flashjit ] || echo "$bin:")${LD_LIBRARY_PATH:-} \
           FLASHJIT_TEMPLATE_DIR=$dir timeout 60 $fj run $args --iters 50 2>&1 | grep -oE 'median [0-9.]+ us' | grep -oE '[0-9.]+')
      line="$line $t ${us:-?}"
    done
    echo "$line us" | sed "s/$v64/64x4096/" | tee -a "$out/next_times.txt"
  done <<EOF2
--shape 64,32,1,128 --heads-kv 8 --seq-kv 4096 --dtype bf16 --kv-dtype e4m3
--shape 1,32,1,128 --heads-kv 8 --seq-kv 32768 --dtype bf16 --kv-dtype e4m3
--shape 64,32,1,64 --heads-kv 8 --seq-kv 4096 --dtype bf16 --kv-dtype e4m3
--shape 64,32,1,128 --heads-kv 8 --seq-kv 4096 --dtype bf16 --kv-dtype e4m3 --varlen $v64 --page-size 16
--shape 64,32,1,128 --heads-kv 8 --seq-kv 4096 --dtype f16 --kv-dtype e4m3
--shape 64,32,1,128 --heads-kv 8 --seq-kv 4096 --dtype bf16
EOF2
done
# The decode's other tiles, stages and swizzles (fewer stages or no K
# pipeline fit 3-4 blocks a multiprocessor instead of 2), with the tree's
# templates and the last set's: the fastest of each.
if [ "${NEXT_SWEEP:-1}" = 1 ]; then
  for t in tree ${sets##* }; do
    dir=$([ "$t" = tree ] || echo "/tmp/fj-$t/templates")
    FLASHJIT_TEMPLATE_DIR=$dir timeout 150 ./flashjit run --shape 64,32,1,128 --heads-kv 8 --seq-kv 4096 --dtype bf16 \
      --kv-dtype e4m3 --pack-gqa --mma mma --softmax regs --sweep --iters 20 >"$out/sweep_$t.log" 2>&1
    echo "fp8 sweep $t: exit $?; $(grep -c ' us' "$out/sweep_$t.log") timed; $(grep -i fastest "$out/sweep_$t.log")"
  done
fi
