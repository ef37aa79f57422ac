#!/bin/bash
# fp8_ring_next.sh OUTDIR -- prepared steps of the FP8 ring against the
# tree's templates, from build/ on the GPU machine.  Each set S is a patch
# (bench/probes/fp8_S.patch) applied onto a copy of the tree's templates.
# None is pending: next, k16 and regs ran on 2026-12-05 and landed (cf46ccd;
# PERF.md C24), regs_widths (every head dim) ran on the H100 the same day
# and landed as 966bfc6 (C25).  With no set, only the tree's medians run.
# First the FP8-KV GPU tests with each patched set (FLASHJIT_TEMPLATE_DIR;
# the test binary is the tree's), then `flashjit run` medians of the
# decode shapes, contiguous and paged, each template folder in turn, twice.
# NEXT_SETS picks the sets (default none), NEXT_TESTS the tests.
set -u
out=${1:-/tmp}
here=$(cd "$(dirname "$0")" && pwd)
sets=${NEXT_SETS-}
for s in $sets; do
  rm -rf /tmp/fj-$s && mkdir /tmp/fj-$s && cp -r "$here/../../templates" /tmp/fj-$s/
  patch=fp8_$s.patch
  # Templates only (a patch's src/ part would need a rebuilt library).
  (cd /tmp/fj-$s && git apply --include='templates/*' "$here/$patch") || { echo "fp8 $s: $patch does not apply"; exit 1; }
  for t in ${NEXT_TESTS-gpu_fp8_kv gpu_fp8_kv_paged}; do
    FLASHJIT_TEMPLATE_DIR=/tmp/fj-$s/templates timeout ${NEXT_TEST_TIMEOUT:-200} ./tests/fj_tests $t >"$out/${s}_$t.log" 2>&1
    echo "fp8 $s $t: exit $? ($(grep -c ' ok$' "$out/${s}_$t.log") ok, $(grep -c FAIL "$out/${s}_$t.log") FAIL)"
  done
done
v64=$(python3 -c 'print(",".join(["1:4096"] * 64))')
for round in 1 2; do
  while IFS= read -r args; do
    line="fp8 r$round $args:"
    for t in tree $sets; do
      dir=$([ "$t" = tree ] || echo "/tmp/fj-$t/templates")
      us=$(FLASHJIT_TEMPLATE_DIR=$dir timeout 60 ./flashjit run $args --iters 50 2>&1 | grep -oE 'median [0-9.]+ us' | grep -oE '[0-9.]+')
      line="$line $t ${us:-?}"
    done
    echo "$line us" | sed "s/$v64/64x4096/" | tee -a "$out/next_times.txt"
  done <<EOF2
--shape 64,32,1,128 --heads-kv 8 --seq-kv 4096 --dtype bf16 --kv-dtype e4m3
--shape 1,32,1,128 --heads-kv 8 --seq-kv 32768 --dtype bf16 --kv-dtype e4m3
--shape 64,32,1,64 --heads-kv 8 --seq-kv 4096 --dtype bf16 --kv-dtype e4m3
--shape 64,32,1,96 --heads-kv 8 --seq-kv 4096 --dtype bf16 --kv-dtype e4m3
--shape 64,32,1,80 --heads-kv 8 --seq-kv 4096 --dtype f16 --kv-dtype e4m3
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
