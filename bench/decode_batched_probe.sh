#!/bin/bash
# decode_batched_probe.sh -- where the batched decode's time goes (issue 9's
# last bar: (64, 32/8, 1/4096, 128) bf16 against cuDNN), from build/ on
# the GPU machine: the pick and its neighbours (key tile, stages, splits),
# the pick rendered from template copies whose cp.async asks L2 for 128 or
# 256 bytes at a time, then ncu's view of the pick and of cuDNN's kernel
# (DRAM throughput, occupancy, grid).  Output: one line per measurement.
set -u
shape="--shape 64,32,1,128 --seq-kv 4096 --heads-kv 8 --dtype bf16"
pick="--mma mma --pack-gqa --tile-m 16 --warps 4 --swizzle xor --softmax regs"
t() { echo "$* | $(./flashjit run $shape --iters 50 "$@" 2>&1 | grep -E '^variant|^time|error|refused' | tr '\n' ' ')"; }
for tdir in "" /tmp/fj-l2-128 /tmp/fj-l2-256; do
  if [ -n "$tdir" ]; then
    rm -rf "$tdir" && cp -r ../templates "$tdir"
    sed -i "s/cp.async.cg.shared.global \[/cp.async.cg.shared.global.L2::${tdir##*-}B [/" "$tdir/tile_io.cuh"
    grep -c "L2::${tdir##*-}B" "$tdir/tile_io.cuh" | sed "s|^|$tdir: cp.async lines changed: |"
  fi
  export FLASHJIT_TEMPLATE_DIR=$tdir
  echo "== templates ${tdir:-as committed}"
  t
  t $pick --tile-n 64 --stages 2
  t $pick --tile-n 64 --stages 3
  t $pick --tile-n 128 --stages 2
  t $pick --tile-n 64 --stages 2 --split-kv --splits 2
  t $pick --tile-n 64 --stages 2 --split-kv --splits 4
  t
done
unset FLASHJIT_TEMPLATE_DIR
ncu --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
  -k regex:fj_attn -c 1 ./flashjit run $shape --iters 1 --warmup 0 2>&1 | grep -vE '^==PROF==|^\s*$' | tail -75
cat >/tmp/cudnn_decode.py <<'EOF'
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
q = torch.empty(64, 32, 1, 128, device="cuda", dtype=torch.bfloat16).normal_()
k = torch.empty(64, 8, 4096, 128, device="cuda", dtype=torch.bfloat16).normal_()
v = torch.empty_like(k).normal_()
torch.cuda.synchronize()
with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
    for _ in range(3):
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
torch.cuda.synchronize()
EOF
ncu --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
  -k regex:'^(?!.*(normal|distribution|elementwise|fill)).*$' --launch-skip 1 -c 2 python3 /tmp/cudnn_decode.py 2>&1 \
  | grep -vE '^==PROF==|^\s*$' | tail -150
