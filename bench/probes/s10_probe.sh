#!/bin/bash
# s10_probe.sh OUTDIR -- the tenth session's first look, from build/ on the
# GPU machine: (1) kernel times by ncu of the single long decodes (16-bit
# pick and 16 splits, FP8 K/V, MLA's latent 576/512) beside their graph
# time from `flashjit run`; (2) the d128 backward's main kernel under ncu's
# full set (the backward bar's first reading); (3) the tuner on the short
# shapes still under cuDNN.
set -u
out=${1:-/tmp}
ncu_t() {  # ncu_t NAME ARGS...: each fj_ kernel's duration (us), 2 launches
  local name=$1; shift
  timeout 120 ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
    --clock-control none -k regex:fj_ ./flashjit run "$@" --iters 2 --warmup 1 >"$out/ncu_$name.log" 2>&1
  echo "ncu $name: exit $? $(grep -E '^  fj_|gpu__time|dram__' "$out/ncu_$name.log" | tail -6 | awk '{print $1, $(NF-1), $NF}' | tr '\n' ' ')"
  local us=$(timeout 60 ./flashjit run "$@" --iters 50 2>&1 | grep -oE 'median [0-9.]+ us')
  echo "run $name: $us"
}
ncu_t d16 --shape 1,32,1,128 --heads-kv 8 --seq-kv 32768 --dtype bf16
ncu_t d16s16 --shape 1,32,1,128 --heads-kv 8 --seq-kv 32768 --dtype bf16 --splits 16 --tile-n 128
ncu_t fp8 --shape 1,32,1,128 --heads-kv 8 --seq-kv 32768 --dtype bf16 --kv-dtype e4m3
ncu_t fp8b --shape 64,32,1,128 --heads-kv 8 --seq-kv 4096 --dtype bf16 --kv-dtype e4m3
ncu_t mla --shape 1,16,1,576 --heads-kv 1 --head-dim-v 512 --latent --seq-kv 32768 --dtype bf16
timeout 200 ncu --set full -k regex:fj_bwd_attn --launch-count 1 -o "$out/bwd128" \
  ./flashjit run --backward --shape 8,16,2048,128 --dtype bf16 --iters 1 --warmup 0 >"$out/ncu_bwd128.log" 2>&1
echo "ncu bwd128: exit $?"
timeout 60 ncu --import "$out/bwd128.ncu-rep" --page details >"$out/bwd128_details.txt" 2>&1
timeout 60 ncu --import "$out/bwd128.ncu-rep" --page source --csv --print-source sass >"$out/bwd128_sass.csv" 2>&1
gzip -f "$out/bwd128_sass.csv"
for sc in 32,8,512,256:none 16,8,1024,256:none 32,32,512,64:top-left; do
  timeout 120 ./flashjit tune --no-save --dtype bf16 --shape "${sc%%:*}" --causal="${sc##*:}" --iters 20 \
    >"$out/short_${sc//[,:]/_}.log" 2>&1
  echo "short $sc: exit $? $(grep -E 'best|default|fastest|library' "$out/short_${sc//[,:]/_}.log" | tail -3 | tr '\n' ' ')"
done
