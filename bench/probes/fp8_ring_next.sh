#!/bin/bash
# fp8_ring_next.sh OUTDIR -- fp8_ring_next.patch (P V in f16 under bf16
# queries; paged FP8 page numbers a tile ahead) against the tree's
# templates, from build/ on the GPU machine: the FP8-KV GPU tests with the
# patched templates first (FLASHJIT_TEMPLATE_DIR; the test binary is the
# tree's), then `flashjit run` medians of the decode shapes, contiguous and
# paged, each template folder in turn, twice.
set -u
out=${1:-/tmp}
here=$(cd "$(dirname "$0")" && pwd)
rm -rf /tmp/fj-next && mkdir /tmp/fj-next && cp -r "$here/../../templates" /tmp/fj-next/
(cd /tmp/fj-next && git apply "$here/fp8_ring_next.patch") || { echo "fp8 next: the patch does not apply"; exit 1; }
for t in ${NEXT_TESTS-gpu_fp8_kv gpu_fp8_kv_paged}; do
  FLASHJIT_TEMPLATE_DIR=/tmp/fj-next/templates timeout ${NEXT_TEST_TIMEOUT:-400} ./tests/fj_tests $t >"$out/next_$t.log" 2>&1
  echo "fp8 next $t: exit $? ($(grep -c ' ok$' "$out/next_$t.log") ok, $(grep -c FAIL "$out/next_$t.log") FAIL)"
done
v64=$(python3 -c 'print(",".join(["1:4096"] * 64))')
for round in 1 2; do
  while IFS= read -r args; do
    line="fp8 next r$round $args:"
    for t in tree /tmp/fj-next/templates; do
      dir=$([ "$t" = tree ] || echo "$t")
      ms=$(FLASHJIT_TEMPLATE_DIR=$dir timeout 60 ./flashjit run $args --iters 50 2>&1 | grep -oE 'median [0-9.]+ us' | grep -oE '[0-9.]+')
      line="$line ${t##*/} ${ms:-?}"
    done
    echo "$line us" | sed "s/$v64/64x4096/" | tee -a "$out/next_times.txt"
  done <<EOF
--shape 64,32,1,128 --heads-kv 8 --seq-kv 4096 --dtype bf16 --kv-dtype e4m3
--shape 1,32,1,128 --heads-kv 8 --seq-kv 32768 --dtype bf16 --kv-dtype e4m3
--shape 64,32,1,64 --heads-kv 8 --seq-kv 4096 --dtype bf16 --kv-dtype e4m3
--shape 64,32,1,128 --heads-kv 8 --seq-kv 4096 --dtype bf16 --kv-dtype e4m3 --varlen $v64 --page-size 16
--shape 64,32,1,128 --heads-kv 8 --seq-kv 4096 --dtype bf16
EOF
done
