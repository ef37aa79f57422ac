#!/bin/bash
# fp8kv.sh OUTDIR -- where the FP8-KV decode's time goes (issue 32 item 4),
# from build/ on the GPU machine: ncu's speed of light, warp states and
# occupancy of the batched decode's kernel, FP8 K/V and 16-bit, then
# `flashjit run` medians of variants of the FP8 kernel, interleaved: the
# pick, the pick without its dequantisation (wrong results, for the time),
# 32-key tiles, two stages, and the 16-bit pick.
set -u
out=${1:-/tmp}
shape="--shape 64,32,1,128 --heads-kv 8 --seq-kv 4096 --dtype bf16"
v="--mma mma --tile-m 16 --warps 4 --swizzle xor --softmax regs --pack-gqa"
for kv in e4m3 bf16; do
  # Bounded: this step once ran past a call's 600 s on the H200.
  timeout ${NCU_TIMEOUT:-150} ncu -f -o /tmp/fp8kv_$kv --section SpeedOfLight --section WarpStateStats --section Occupancy \
    --section LaunchStats --section MemoryWorkloadAnalysis --clock-control none -k regex:fj_attn -c 1 \
    ./flashjit run $shape --kv-dtype $kv --iters 1 --warmup 0 2>&1 | grep -vE '^==PROF==' | tail -2
  ncu --import /tmp/fp8kv_$kv.ncu-rep --page details 2>&1 | grep -vE '^\s*$' >"$out/fp8kv_ncu_$kv.txt"
  grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Issue Slots|Warp Cycles Per Issued|Stall|Achieved Occupancy|Theoretical Occupancy|Block Limit|Registers Per|No Eligible|Active Warps Per" \
    "$out/fp8kv_ncu_$kv.txt" | head -30 | sed "s/^/ncu $kv: /"
done
rm -rf /tmp/fj-nodq && cp -r /work/main/templates /tmp/fj-nodq
sed -i 's/fj::dequant_tile(/if (0) fj::dequant_tile(/' /tmp/fj-nodq/attention_mma.cu
for round in 1 2; do
  while IFS='|' read -r name tdir args; do
    ms=$(FLASHJIT_TEMPLATE_DIR=$tdir ./flashjit run $shape $args --iters 50 2>&1 | grep -oE 'median [0-9.]+ us' | grep -oE '[0-9.]+')
    echo "fp8kv probe round $round $name: ${ms:-?} us"
  done <<EOF
pick||--kv-dtype e4m3
no-dequant|/tmp/fj-nodq|--kv-dtype e4m3 $v --tile-n 64 --stages 3
m64 n32 s3||--kv-dtype e4m3 --mma mma --tile-m 64 --warps 4 --swizzle xor --softmax regs --pack-gqa --tile-n 32 --stages 3
stages 2||--kv-dtype e4m3 $v --tile-n 64 --stages 2
bf16 pick||
EOF
done
