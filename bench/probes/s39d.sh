#!/bin/bash
# s39d.sh OUTDIR -- the H200's single decodes after 5d1cb94 (issue 34's
# bars: MLA 0.8 of a copy, the 16-bit d128 decode over 32k keys 0.85), on
# an H200 (elsewhere every case of bench/mla_compare.py once, then stop): bench/mla_compare.py
# --cases 0,1 (predicted about 18.3 us, 0.78 of a copy at 32k), then
# s38a.sh's decode part (bench/decode_probe.py --long, fp8_kv_compare.py;
# its predictions are there).  Bounded by S39D_SECONDS (240).
set -u
. bench/probes/parts_lib.sh
parts_start s39d "${1:-}" ${S39D_SECONDS:-240}
if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  # Elsewhere (an H100): every MLA case of bench/mla_compare.py, once.
  PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s39d timeout $(bound 200) \
    python3 bench/mla_compare.py --iters 50 --out "$out" >"$out/mla_all.log" 2>&1
  echo "mla all: exit $?"; grep -E '^mla|Error' "$out/mla_all.log" | cut -c1-220
  exit 0
fi
part_mla() {
  PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s39d timeout $(bound 80) \
    python3 bench/mla_compare.py --cases 0,1 --iters 50 --out "$out" >"$out/mla.log" 2>&1
  echo "mla: exit $?"; grep -E '^mla|Error' "$out/mla.log" | cut -c1-220
}
part_decode() { S38A_PARTS=decode S38A_SECONDS=$(bound 160) bash bench/probes/s38a.sh "$out/s38a"; }
parts_run s39d mla decode
