#!/bin/bash
# mla_paged.sh OUTDIR -- MLA's paged decode (issue 34 item 3), from build/ on
# the GPU machine: bench/mla_compare.py, then `flashjit run` medians of the
# paged decode (64, 16/1, 1/4096, 576/512, pages of 64) with the pick and
# with other tiles, warps and stages, twice, interleaved.
set -u
out=${1:-/tmp}
(cd .. && FLASHJIT_LIB=build/libflashjit.so timeout ${MLA_TIMEOUT:-150} python3 bench/mla_compare.py \
  --iters 30 --out "$out" >"$out/mla.log" 2>&1; echo "mla_compare: exit $?")
grep -E "^mla|Error|error" "$out/mla.log" | head -20
v64=$(python3 -c 'print(",".join(["1:4096"] * 64))')
shape="--shape 64,16,1,576 --heads-kv 1 --seq-kv 4096 --head-dim-v 512 --latent --dtype bf16 --varlen $v64 --page-size 64"
fl="--mma mma --tile-m 16 --swizzle pad --softmax regs --pack-gqa --split-kv"
for round in 1 2; do
  while IFS='|' read -r name args; do
    us=$(timeout 60 ./flashjit run $shape $args --iters 50 2>&1 | grep -oE 'median [0-9.]+ us' | grep -oE '[0-9.]+')
    echo "mla paged r$round $name: ${us:-?} us"
  done <<X
pick|
n64 w4 s1|$fl --tile-n 64 --warps 4 --stages 1
n32 w2 s2|$fl --tile-n 32 --warps 2 --stages 2
n32 w2 s3|$fl --tile-n 32 --warps 2 --stages 3
contiguous|--shape 64,16,1,576 --heads-kv 1 --seq-kv 4096 --head-dim-v 512 --latent --dtype bf16
X
done
