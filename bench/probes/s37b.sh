#!/bin/bash
# s37b.sh OUTDIR -- where the long single decode's fixed ~9 us go (issue 34
# item 4: 32k keys at 0.80 of a copy's rate, 64k at 0.89; the marginal
# rate between them is above the copy's, so the gap is fixed per call).
# From the repository root with build/ carried.  Parts (S37B_PARTS,
# default "dprof"), bounded by S37B_SECONDS (300):
#   dprof  ncu on (1, 32/8, 1/32768, 128) bf16 at 16 and 29 splits (the
#          pick) and at 64k keys: each kernel's duration, DRAM bytes and
#          throughput, the attention kernel's active-SM share and waves;
#          then the graph-replayed times (bench/decode_probe.py --long).
#          Read: graph time - (attention + combine durations) = the gaps;
#          combine's duration = what a fused last-block combine could save.
set -u
. bench/probes/parts_lib.sh
parts_start s37b "${1:-}" ${S37B_SECONDS:-300}
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__cycles_active.avg,sm__cycles_elapsed.max,launch__waves_per_multiprocessor,launch__grid_size,launch__occupancy_limit_registers,sm__warps_active.avg.pct_of_peak_sustained_active
part_dprof() {
  local s kv
  for kv in 32768 65536; do
    for s in 16 29 auto; do
      (cd build && timeout $(bound 60) ncu --metrics $M --clock-control none --cache-control none -k regex:"fj_attn|fj_combine" -c 4 \
        ./flashjit run --shape 1,32,1,128 --seq-kv $kv --heads-kv 8 --dtype bf16 --splits $s --iters 2 --warmup 1 \
        >"$out/dprof_${kv}_$s.log" 2>&1)
      echo "dprof kv=$kv splits=$s: $(grep -E '^  fj_|gpu__time|dram__|sm__cycles|waves|grid_size|occupancy_limit|warps_active' "$out/dprof_${kv}_$s.log" | tail -22 | awk '{print $1, $NF}' | tr '\n' ' ')"
    done
  done
  (FLASHJIT_LIB=build/libflashjit.so PYTHONUNBUFFERED=1 timeout $(bound 120) python3 bench/decode_probe.py --long --iters 30 \
     >"$out/decode_probe.log" 2>&1)
  grep -E "^decode" "$out/decode_probe.log" | cut -c1-200
}
parts_run s37b ${S37B_PARTS:-dprof}
