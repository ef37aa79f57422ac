#!/bin/bash
# s38a.sh OUTDIR -- the next session's H200 call, prepared in the
# thirty-seventh (whose device time went to failed starts and two H100
# calls): from the repository root with build/ carried (main's build,
# slimmed, with libflashjit_torch.so).  S38A_PARTS (default "decode
# bf16det d192"), the whole bounded by S38A_SECONDS (560):
#   decode  the split rule's 16 splits on the H200 (db0543e; H100 D3/K3:
#           0.886 and FP8 0.94 of copy): bench/decode_probe.py --long and
#           bench/fp8_kv_compare.py.  Predicted on the H200: the 16-bit
#           single decode over 32k keys 38.8-39.5 us, 0.82-0.83 of copy
#           (D1's forced 16 splits: 38.8), the bar's 0.85 still missed by
#           about the combine's 1-2 us; FP8 KV over 32k 0.88-0.92 (K2's 0.85
#           at 29 splits, the H100's 0.94).
#   bf16det s35a.sh's bf16det: deterministic / default at d96, d128 and
#           three GQA cases on the H200 since 77c7c62 (issue 31's <= 1.25;
#           the H100's T21: 1.19, 1.11-1.13, 1.18).
#   d192    the cluster pair at d192 on the H200 (bench/bwd_compare.py
#           --dims 192, bf16): cuDNN / flashjit and deterministic /
#           default (H100 T21: 1.259 / 1.167; 1.251 / 1.242).
#   f16     s34a.sh's f16: the backward's fp16 sweep (issue 31's fp16 half).
set -u
. bench/probes/parts_lib.sh
parts_start s38a "${1:-}" ${S38A_SECONDS:-560}
py() { PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s38a PYTHONUNBUFFERED=1 timeout $(bound "$1") python3 "${@:2}"; }
part_decode() {
  py 100 bench/decode_probe.py --long --iters 30 >"$out/decode.log" 2>&1
  echo "decode: exit $?"; grep -E "^decode" "$out/decode.log" | grep -v tile_n | cut -c1-160
  py 80 bench/fp8_kv_compare.py >"$out/fp8kv.log" 2>&1
  echo "fp8kv: exit $?"; grep -E "^fp8kv" "$out/fp8kv.log" | head -4 | cut -c1-260
}
part_bf16det() { S35A_PARTS=bf16det S35A_SECONDS=$(bound 200) bash bench/probes/s35a.sh "$out/s35a"; }
part_d192() {
  py 170 bench/bwd_compare.py --dims 192 --dtypes bf16 --gqa "2,16,4,4096,192,1" --out "$out/d192" >"$out/d192.log" 2>&1
  echo "d192: exit $?"; grep -E "geomean|gqa|Error" "$out/d192.log" | cut -c1-400
}
part_f16() { S34A_PARTS=f16 S34A_SECONDS=$(bound 220) bash bench/probes/s34a.sh "$out/s34a"; }
parts_run s38a ${S38A_PARTS:-decode bf16det d192}
